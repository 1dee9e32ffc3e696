"""`bebop bench rl`: RL step time with MTP + rejection sampling vs without, measured side by side.

For each task it runs the same GRPO job (same seed, prompts and config) twice on the embedded default (or `--policy`,
a checkpoint directory or hub id, whose `--heads` are found by the rules of `bebop.policy`):
rollouts by plain decoding ("none") and by RS with the frozen e2e TV head, both async unless `--sync`;
optionally a third run with the CE head (`--heads e2e_tv ce`) to compare how accept length drifts as RL
moves the policy. Reported per task, from medians over the steps after the first (warm-up):

    speedup_end_to_end  = step time (none) / step time (rs)        what an RL user waits for
    speedup_rollout     = generation time (none) / generation time (rs)
    accept_length, its drift first -> last quarter of the run, reward, entropy, staleness

The top-level `speedup_end_to_end` / `speedup_rollout` are the first task's (math by default). Several
`--prompts` values sweep the effective batch (rows = prompts x group, the paper's regime axis: the gain is
largest where few rows decode at once); the JSON's `tasks` then hold the first value's results and `sweep`
all of them. In async mode the step time is max(generation, update) plus what does not overlap, so the
end-to-end gain is at most the rollout gain and shrinks when the update, not generation, is the bottleneck.
Numbers on a shared 2-core CPU are noisy: `--repeats` alternates the runs and takes medians across them.

`--self-draft policy|deep|small|qwen3-0.6b` asks what the best possible head would give on this machine: the policy
and its heads become a self-draft pair (bebop.models.selfdraft: the draft is the target, so RS accepts every draft) of
the policy's shape, of `ModelConfig.deep` (16 narrow layers, where one head layer costs a tenth of a step, as on real
checkpoints) or, larger, of Qwen3-0.6B's width in 3 layers ("small") or all 28 ("qwen3-0.6b", a GPU's shape), each at
the tokenizer's vocabulary, trained at lr 0 so the draft stays exact while the update still costs what it costs. Its text is
noise that ends where a stop token happens to be drawn, so this bounds acceptance, not the long tail of a trained
policy's row lengths.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from bebop.commands.device_args import add_device_args
from bebop.commands.gamma_arg import gamma_arg, static
from bebop.commands.outputs import check_new_run_dirs
from bebop.commands.prompt_args import add_prompt_args, prompt_fields
from bebop.policy import HEAD_HELP, POLICY_HELP
from bebop.rl.compare import run_once, summarize
from bebop.rl.config import TASKS, RLConfig

SELF_DRAFT_SHAPES = ("policy", "deep", "small", "qwen3-0.6b")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--tasks", nargs="+", default=["math", "agent"],
                        help=f"tasks from {list(TASKS)} and/or datasets (jsonl:PATH, parquet:PATH, a save_to_disk "
                             "directory) and reasoning-gym tasks (gym:NAME?FIELD=VALUE&...) (default: %(default)s)")
    add_prompt_args(parser)
    parser.add_argument("--heads", nargs="+", default=["e2e_tv"],
                        help=f"frozen heads to compare, each {HEAD_HELP} (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, nargs="+", default=[8],
                        help="prompts per step; several values sweep the effective batch (rows = prompts x group)")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", nargs="+", type=gamma_arg, default=[3],
                        help="draft depths of the MTP runs, each an int >= 1, 'auto' (chosen per engine step) or 'rows' "
                             "(each row its own per step); "
                             "several are timed in the same interleaved rounds (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1, help="alternate the runs this many times")
    parser.add_argument("--micro-batch-tokens", type=int, default=RLConfig.micro_batch_tokens,
                        help="computed tokens per update micro-batch (0 = the whole batch at once)")
    parser.add_argument("--no-shared-prompts", action="store_true",
                        help="compute each row's prompt in the update (with --micro-batch-tokens 0: the padded rows)")
    parser.add_argument("--sync", action="store_true", help="sync mode instead of the default async")
    parser.add_argument("--with-sync", action="store_true", help="also run plain decoding in sync mode (async gain)")
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: temp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--self-draft", choices=SELF_DRAFT_SHAPES, default=None,
                        help="replace the policy and heads by a perfect draft pair of this shape "
                             "(the ceiling of MTP on this machine; default: the policy as it is)")
    add_device_args(parser, dtype_help="the rollout snapshot's dtype (the update keeps float32 master weights)")


def check_args(args: argparse.Namespace) -> dict:
    """Refuse bad names and numbers before the default policy loads (RLConfig would, but naming no flag); the
    tasks, each built (a dataset read) once for every run."""
    from bebop.checks import check_flags
    from bebop.data.tasks import DatasetConfig, check_task_names, get

    dataset = DatasetConfig(prompt_key=args.prompt_key, answer_key=args.answer_key)
    tasks = {name: get(name, dataset) for name in check_task_names(args.tasks)}
    if any(g < 1 for g in static(args.gamma)):
        raise ValueError(f"--gamma values must be >= 1, 'auto' or 'rows' (plain decoding is always run), "
                         f"got {args.gamma}")
    check_flags(args, ("--steps", "--max-new-tokens", "--repeats", "--prompts"), low=1)
    check_flags(args, ("--group",), low=2)  # GRPO compares completions within a group
    check_flags(args, ("--micro-batch-tokens", "--seed"), low=0)  # 0 tokens: the whole batch at once
    return tasks


def self_draft_default(default, shape: str):
    """`default` with its policy and every head replaced by one self-draft pair (q = p) of the policy's shape
    ("policy") or of ModelConfig.deep ("deep") at the tokenizer's vocabulary."""
    from bebop.models.config import ModelConfig
    from bebop.models.selfdraft import self_draft_pair

    if shape not in SELF_DRAFT_SHAPES:
        raise ValueError(f"unknown self-draft shape {shape!r}; valid names: {list(SELF_DRAFT_SHAPES)}")
    config = default.model.config
    if shape == "deep":
        config = ModelConfig.deep(vocab_size=config.vocab_size)
    elif shape in ("small", "qwen3-0.6b"):
        config = ModelConfig.small(vocab_size=config.vocab_size, num_hidden_layers=3 if shape == "small" else 28)
    model, head = self_draft_pair(config, seed=0)
    model.name_or_path = head.name_or_path = f"self-draft {shape}"  # what its runs say made them: not the policy
    dtype = default.model.lm_head.weight.dtype
    return dataclasses.replace(default, model=model.to(dtype), heads={name: head.to(dtype) for name in default.heads})


def bench_task(default, task: str, prompts: int, args, root: Path, built=None) -> dict:
    base = RLConfig.quick(task=task, steps=args.steps, prompts_per_step=prompts, group_size=args.group,
                          max_new_tokens=args.max_new_tokens,
                          mode="sync" if args.sync else "async", seed=args.seed, checkpoint_every=0,
                          micro_batch_tokens=args.micro_batch_tokens, share_prompts=not args.no_shared_prompts,
                          device=args.device, dtype=args.dtype,
                          **({"lr": 0.0} if args.self_draft else {}), **prompt_fields(args))
    # Every γ beside plain decoding in the same interleaved rounds; a run's name carries its γ when several are timed.
    variants = [("none", None, base.mode, None)] + [("rs", head, base.mode, g) for g in args.gamma
                                                     for head in default.heads]
    if args.with_sync and not args.sync:
        variants.append(("none", None, "sync", None))
    results: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for rollout, head, mode, gamma in variants:
            name = f"{task}-{rollout}" + (f"-{head}" if head else "") + ("-sync" if mode != base.mode else "")
            name += (f"-g{gamma}" if gamma is not None and len(args.gamma) > 1 else "") + f"-{repeat}"
            run_dir = root / (f"rows{base.batch_size}-{name}" if len(args.prompts) > 1 else name)
            depth = {} if gamma is None else {"gamma": gamma}
            records = run_once(default, base.replace(method=rollout, mode=mode, **depth), head, run_dir, task=built)
            results.setdefault(name.rsplit("-", 1)[0], []).append(summarize(records))
    merged = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in results.items()}
    plain = merged[f"{task}-none"]
    spec_names = [f"{task}-rs-{next(iter(default.heads))}" + (f"-g{g}" if len(args.gamma) > 1 else "")
                  for g in args.gamma]
    spec = merged[spec_names[0]]
    result = {"task": task, "mode": base.mode, "prompts": prompts, "rows": base.batch_size,
              "self_draft": args.self_draft, "speedup_end_to_end": plain["step_s"] / spec["step_s"],
              "speedup_rollout": plain["gen_s"] / spec["gen_s"], "runs": merged}
    if len(args.gamma) > 1:  # per γ (the first head): what each depth gave over plain decoding, side by side
        result["by_gamma"] = {str(g): {"speedup_end_to_end": plain["step_s"] / merged[n]["step_s"],
                                       "speedup_rollout": plain["gen_s"] / merged[n]["gen_s"]}
                              for g, n in zip(args.gamma, spec_names)}
    if f"{task}-none-sync" in merged:
        result["speedup_async_over_sync"] = merged[f"{task}-none-sync"]["step_s"] / plain["step_s"]
    return result


def print_table(results: list[dict]) -> None:
    print(f"{'run':<22}{'step s':>8}{'gen s':>8}{'upd s':>8}{'reward':>8}{'H nats':>8}{'acc len':>16}{'drift':>8}")
    for result in results:
        for name, s in result["runs"].items():
            acc = f"{s['accept_length']:.2f}" if "accept_length" in s else "-"
            if "gamma_mean" in s:
                acc += f" (γ~{s['gamma_mean']:.1f})"
            drift = f"{100 * s['accept_length_drift']:+.1f}%" if "accept_length_drift" in s else "-"
            print(f"{name:<22}{s['step_s']:>8.2f}{s['gen_s']:>8.2f}{s['update_s']:>8.2f}{s['reward_mean']:>8.3f}"
                  f"{s['entropy']:>8.3f}{acc:>16}{drift:>8}")
        ceiling = f", self-draft ceiling ({result['self_draft']} shape)" if result["self_draft"] else ""
        print(f"  {result['task']} ({result['mode']}, {result['rows']} rows{ceiling}): "
              f"end-to-end speedup {result['speedup_end_to_end']:.2f}x, "
              f"rollout speedup {result['speedup_rollout']:.2f}x"
              + (f", async over sync (no MTP) {result['speedup_async_over_sync']:.2f}x"
                 if "speedup_async_over_sync" in result else ""))
        for gamma, speed in result.get("by_gamma", {}).items():
            print(f"    γ={gamma}: rollout speedup {speed['speedup_rollout']:.2f}x, "
                  f"end-to-end {speed['speedup_end_to_end']:.2f}x")


def run(args: argparse.Namespace) -> int:
    from bebop.device import resolve_device, resolve_dtype
    from bebop.policy import load_policy_heads

    tasks = check_args(args)
    check_new_run_dirs([args.out], "--out")  # its runs are written there: never beside or over older ones
    resolve_device(args.device)  # --device cuda without CUDA: one line, before the policy loads
    default = load_policy_heads(args.policy, args.heads, dtype=resolve_dtype(None, "cpu"))
    if args.self_draft:
        default = self_draft_default(default, args.self_draft)
    with tempfile.TemporaryDirectory(prefix="bebop-bench-rl-") as tmp:
        root = args.out or Path(tmp)
        results = [bench_task(default, task, prompts, args, root, tasks[task]) for prompts in args.prompts
                   for task in args.tasks]
    print_table(results)
    first = [r for r in results if r["prompts"] == args.prompts[0]]
    out = {"speedup_end_to_end": first[0]["speedup_end_to_end"], "speedup_rollout": first[0]["speedup_rollout"],
           "self_draft": args.self_draft, "tasks": {r["task"]: r for r in first}}
    if len(args.prompts) > 1:  # the effective-batch sweep: speedups per task and rows per step
        out["sweep"] = [{k: r[k] for k in ("task", "prompts", "rows", "speedup_end_to_end", "speedup_rollout")}
                        for r in results]
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0
