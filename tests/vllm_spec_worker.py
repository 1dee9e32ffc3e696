"""One vLLM run for tests/test_vllm_plugin.py, in its own process (one engine per process keeps memory flat):

    python tests/vllm_spec_worker.py '{"policy": DIR, "draft": DIR | null, "method": "rs" | "to", "gamma": 3,
                                       "temperature": 1.0, "prompts": [[ids]], "max_tokens": 200, "stop": [1],
                                       "seed": 0}'

prints one JSON line: {"tokens": [[ids]], "spec": {bebop's spec/* counter names: values}}. With "draft" null vLLM
decodes plainly. The bebop plugin is registered by hand (the entry point needs bebop installed with it).
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# vLLM's spec-decode counters -> bebop's names (DESIGN.md "Metrics vocabulary")
COUNTERS = {"vllm:spec_decode_num_drafts": "spec/num_drafts", "vllm:spec_decode_num_draft_tokens":
            "spec/num_draft_tokens", "vllm:spec_decode_num_accepted_tokens": "spec/num_accepted_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(metrics) -> dict:
    out = {}
    for m in metrics:
        if m.name in COUNTERS:
            out[COUNTERS[m.name]] = m.value
        elif m.name == PER_POS:
            out.update({f"spec/num_accepted_tokens_per_pos/{i}": v for i, v in enumerate(m.values)})
    return out


def main(job: dict) -> dict:
    from bebop.vllm_plugin import register, speculative_config

    register()
    from vllm import LLM, SamplingParams

    spec = None if job["draft"] is None else speculative_config(job["draft"], gamma=job["gamma"],
                                                                method=job["method"])
    llm = LLM(job["policy"], speculative_config=spec, enforce_eager=True, dtype="float32", max_model_len=1024,
              seed=job["seed"], disable_log_stats=False, gpu_memory_utilization=0.15)
    params = [SamplingParams(temperature=job["temperature"], max_tokens=job["max_tokens"], stop_token_ids=job["stop"],
                             seed=job["seed"] + i) for i in range(len(job["prompts"]))]
    outs = llm.generate([{"prompt_token_ids": p} for p in job["prompts"]], params, use_tqdm=False)
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs], "spec": spec_counters(llm.get_metrics())}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
