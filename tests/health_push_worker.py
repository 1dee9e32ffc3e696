"""A GRPO run whose rollout backend gets a corrupt MTP head pushed mid-run, for the draft-health tests; one run per
process (vLLM holds process-wide state):

    python tests/health_push_worker.py BACKEND AT RUN_DIR     # BACKEND: bebop | vllm

The default policy drafts with its e2e_tv head (RS, γ = 3, head frozen); the push after update AT sends a head of
random weights with the policy, as a weight sync gone wrong would. Prints one JSON line: per step, its
`draft_health/*` fields.
"""

import copy
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main(backend: str, at: int, run_dir: str) -> list[dict]:
    import torch
    from test_draft_health import randomised  # this script's directory, tests/, is first on sys.path

    from bebop.default import load_default
    from bebop.rl import RLConfig, build_trainer
    from bebop.rl.draft_health import HealthConfig
    from bebop.tasks import get

    default = load_default(dtype=torch.float32)
    config = RLConfig.tiny(backend=backend, method="rs", gamma=3, mode="sync", steps=at + 2 + HealthConfig().window,
                           prompts_per_step=4,
                           group_size=4, max_new_tokens=32, checkpoint_every=0)
    trainer = build_trainer(config, default.model, default.tokenizer, head=default.heads["e2e_tv"], run_dir=run_dir,
                            task=get("math"))
    refresh = trainer._refresh_snapshot

    def corrupt_push() -> None:  # sync mode: after each update
        refresh()
        if trainer.version == at + 1:
            trainer.rollouts.backend.push_weights(trainer.policy, randomised(copy.deepcopy(trainer.head)))

    trainer._refresh_snapshot = corrupt_push
    return [{k: v for k, v in r.items() if k.startswith("draft_health/")} for r in trainer.run()]


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
