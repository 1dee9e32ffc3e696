"""`bebop rl`: GRPO with speculative rollouts from the command line.

    bebop rl --preset quick --task math --rollout rs --mtp frozen --out runs/rl-math-rs
    bebop rl --preset quick --task agent --rollout none --sync --out runs/rl-agent-plain
    bebop rl --out runs/rl-math-rs --resume          # continue a stopped run as it was recorded
    bebop rl --backend vllm --rollout none --out runs/rl-math-vllm   # rollouts in an in-process vLLM (bebop[vllm])
    bebop rl --entropy-target 0.6 --out runs/rl-entropy               # TRL's adaptive entropy bonus toward 0.6 nats
    bebop rl --shadow-heads ce online-tv:e2e_tv --out runs/rl-heads   # other heads scored on the same rollouts

The policy is the embedded default unless `--policy` names a checkpoint directory in the Hugging Face layout with
its tokenizer, or a hub id; `--head` picks the MTP head: a head saved beside the policy (POLICY/heads/NAME), the
head stored in its checkpoint ("embedded", or its objective), or a save_head directory, tried in that order
(`bebop.policy` reads them all).
Async is the default mode; `--sync` runs generation and update one after the other. `--shadow-heads` takes head
specs as `--head` does, each optionally `LABEL=` and `online-tv:` / `online-ce:` (`bebop.rl.shadow_spec`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from pathlib import Path

from bebop.commands.device_args import add_device_args
from bebop.commands.flags import FIELD_FLAGS, flag_of, given, recorded_config, resumed
from bebop.commands.gamma_arg import gamma_arg
from bebop.commands.outputs import check_run_dir
from bebop.commands.prompt_args import add_prompt_args, prompt_fields
from bebop.default import shipped_heads
from bebop.policy import HEAD_HELP, POLICY_HELP, check_head, check_policy, load_policy, load_policy_heads
from bebop.rl.config import BACKENDS, MTP_STRATEGIES, PRESET_VALUES, PRESETS, ROLLOUTS, TASKS, RLConfig
from bebop.rl.entropy_control import COEF_DELTA, COEF_MAX, COEF_MIN
from bebop.rl.shadow_spec import parse_shadow_specs
from bebop.runlog.mirror import add_mirror_arguments, mirrors_from_args
from bebop.runlog.write import finished_step


def _preset_default(field: str) -> str:
    """Help text for a flag that overrides a preset's field: each preset's own value, read from RLConfig."""
    return "default: the preset's (" + ", ".join(f"{p} {getattr(RLConfig.preset(p), field)}" for p in PRESETS) + ")"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="quick", help=f"one of {list(PRESETS)} (default: %(default)s)")
    parser.add_argument("--task", default="math",
                        help=f"one of {list(TASKS)}, or a dataset: jsonl:PATH, parquet:PATH or a save_to_disk "
                             "directory, or a reasoning-gym task: gym:NAME?FIELD=VALUE&... (docs/tasks.md) "
                             "(default: %(default)s)")
    parser.add_argument("--rollout", default="rs",
                        help=f"one of {list(ROLLOUTS)}; none = plain decoding, no MTP (default: %(default)s)")
    parser.add_argument("--mtp", default="frozen",
                        help=f"what RL does to the head: one of {list(MTP_STRATEGIES)} (default: %(default)s)")
    parser.add_argument("--backend", default="bebop",
                        help=f"who generates the rollouts: one of {list(BACKENDS)}; vllm runs an in-process vLLM "
                             "engine colocated with the trainer, the policy pushed into it after every update "
                             "(needs bebop[vllm]; to/rs draft with the head in vLLM through bebop's vLLM plugin) "
                             "(default: %(default)s)")
    parser.add_argument("--sync", action="store_true", help="no overlap of generation and update (default: async)")
    add_run_arguments(parser)
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--head", default="e2e_tv",
                        help=f"MTP head: {HEAD_HELP}; the embedded default has {shipped_heads()} "
                             "(default: %(default)s)")
    parser.add_argument("--steps", type=int, default=None, help=f"RL steps; {_preset_default('steps')}")
    parser.add_argument("--seed", type=int, default=None,
                        help=f"seed of the prompts and of sampling (each step's a function of it); "
                             f"{_preset_default('seed')}")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"the policy's AdamW learning rate; {_preset_default('lr')}")
    parser.add_argument("--prompts", type=int, default=None,
                        help=f"prompts per step; {_preset_default('prompts_per_step')}")
    parser.add_argument("--group", type=int, default=None,
                        help=f"completions per prompt (GRPO compares within a group); {_preset_default('group_size')}")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"tokens per completion; {_preset_default('max_new_tokens')}")
    parser.add_argument("--gamma", type=gamma_arg, default=None,
                        help="draft depth γ of TO/RS rollouts and of the online head's loss, 'auto' (the engine "
                             "chooses each step's γ in 0..--max-gamma from measured acceptance and step costs) or "
                             "'rows' (each row its own γ per step, under a verify-token budget) "
                             f"(default: auto; with --backend vllm, which fixes γ at start, {RLConfig.gamma})")
    parser.add_argument("--max-gamma", type=int, default=None,
                        help=f"with --gamma auto or rows, the deepest draft; {_preset_default('max_gamma')}")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per phase (default: half the cores each for generation and update)")
    parser.add_argument("--micro-batch-tokens", type=int, default=None,
                        help="computed tokens per update micro-batch of prompt groups (0 = the whole batch at once); "
                             f"{_preset_default('micro_batch_tokens')}")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help=f"steps between checkpoints (0 = only at the end); {_preset_default('checkpoint_every')}")
    add_entropy_arguments(parser)
    parser.add_argument("--shadow-heads", nargs="+", default=None, metavar="HEAD",
                        help="heads scored on every step's rollouts beside the run's own (labelled 'rollout'), both "
                             "rules, into the shadow stream: [LABEL=][online-tv:|online-ce:]HEAD, HEAD as --head takes "
                             "it; an online one is a copy trained on the same rollouts (docs/runs.md) (default: none)")
    add_device_args(parser, dtype_help="the rollout snapshot's dtype and the update's autocast dtype (float32 master "
                                       "weights); bf16 runs on every CPU, slowly where it is emulated",
                    dtype_aliases=("--gen-dtype",), dtype_default=None)
    add_prompt_args(parser)
    add_mirror_arguments(parser)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The run's own flags: where it is written, whether it continues one, what it is called, what it prints."""
    parser.add_argument("--out", type=Path, required=True, help="run directory (created; must be new unless --resume)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last checkpoint, with the settings it recorded; a "
                             "flag given beside it may change only --steps, --threads, --checkpoint-every, "
                             "--micro-batch-tokens and --device (default: a new run)")
    parser.add_argument("--name", default=None, help="run name shown by the dashboard (default: the directory name)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: one on stderr)")


def add_entropy_arguments(parser: argparse.ArgumentParser) -> None:
    """The GRPO loss's entropy bonus, under TRL's names (bebop.rl.entropy_control)."""
    parser.add_argument("--entropy-coef", type=float, default=None,
                        help="the loss's entropy bonus coefficient c (L - c·H, H the policy's token-mean entropy; "
                             "< 0 sharpens); with --entropy-target, the adaptive rule's start (default: 0, no bonus)")
    parser.add_argument("--entropy-target", type=float, default=None, metavar="NATS",
                        help="TRL's adaptive rule: each step c rises by --entropy-coef-delta while the policy's mean "
                             "entropy is at or below NATS, falls otherwise, and applies only at or below it "
                             "(default: none, a constant c)")
    for flag, default, what in (("--entropy-coef-min", COEF_MIN, "lowest"), ("--entropy-coef-max", COEF_MAX, "highest"),
                                ("--entropy-coef-delta", COEF_DELTA, "step per RL step of the")):
        parser.add_argument(flag, type=float, default=None,
                            help=f"with --entropy-target, the {what} coefficient (default: {default}, TRL's)")


# Flags that set the RLConfig field of another name.
SIZE_FLAGS = {"prompts": "prompts_per_step", "group": "group_size"}
NUMBERS = ("steps", "seed", "lr", "gamma", "max_gamma", "threads", "micro_batch_tokens", "checkpoint_every",
           "max_new_tokens", "prompts", "group",
           "entropy_coef", "entropy_target", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta")


def config_from_args(args: argparse.Namespace) -> RLConfig:
    return config_and_note(args)[0]


def config_and_note(args: argparse.Namespace) -> tuple[RLConfig, str | None]:
    """The run's config, checked (no torch), and with `--resume` the line that says what the flags changed: a new
    run is the preset with the flags over it; a resumed one is its recorded config, a flag given where the resume
    may change it (`bebop.commands.flags.resumed`)."""
    adaptive_only = [f"--{k.replace('_', '-')}" for k in NUMBERS[-3:] if getattr(args, k) is not None]
    if adaptive_only and args.entropy_target is None:
        raise ValueError(f"{', '.join(adaptive_only)} bound or step the adaptive entropy coefficient: pass "
                         "--entropy-target too")
    fields = _flag_fields(args)
    recorded = recorded_config(args.out) if args.resume else None
    if recorded is None:
        if args.gamma is None and args.backend != "vllm":  # vLLM fixes the depth at start: there the field's default
            fields["gamma"] = "auto"
        return RLConfig.preset(args.preset, **fields), None
    run, typed = RLConfig.from_dict(recorded), given(args)
    wanted = {k: v for k, v in fields.items() if FIELD_FLAGS.get(k, k) in typed}
    preset = PRESET_VALUES.get(args.preset, {}) if "preset" in typed else {}
    changes, note = resumed(run, {**preset, **wanted}, RLConfig.RESUMABLE, f"--out {args.out}",
                            lambda k: flag_of(k) if k in wanted else f"--preset {args.preset} ({flag_of(k)})")
    return run.replace(**changes), note


def _flag_fields(args: argparse.Namespace) -> dict:
    """RLConfig field -> value of each flag that sets one (numbers left out are the preset's)."""
    fields = {SIZE_FLAGS.get(k, k): getattr(args, k) for k in NUMBERS if getattr(args, k) is not None}
    fields.update(task=args.task, method=args.rollout, mtp=args.mtp, mode="sync" if args.sync else "async",
                  device=args.device, backend=args.backend, **prompt_fields(args))
    if args.shadow_heads:
        fields["shadow_heads"] = tuple(args.shadow_heads)
    if args.dtype is not None:
        fields["dtype"] = args.dtype
    return fields


def run(args: argparse.Namespace) -> int:
    """One process, or one rank of `torchrun --nproc-per-node N -m bebop rl ...`."""
    config, note = config_and_note(args)  # bad names, values and resumes fail here, before torch loads
    check_run_dir(args.out, resume=args.resume, flag="--out")
    watch = f"watch it: bebop dashboard --runs {args.out.parent}"
    if args.resume and (finished := finished_step(args.out, config.steps)) is not None:
        print(f"{args.out}: already finished (step {finished} of --steps {config.steps}); nothing to resume, "
              "pass a larger --steps to continue it")
        print(watch)
        return 0
    check_head(args.policy, args.head if config.uses_head else None)
    for spec in parse_shadow_specs(config.shadow_heads):
        check_head(args.policy, spec.head)
    mirrors = mirrors_from_args(args)  # a missing tensorboard / wandb package fails here, before any work
    check_policy(args.policy)
    from bebop import distributed
    from bebop.device import resolve_device

    world = distributed.init(resolve_device(config.device))  # --device cuda without CUDA: one line, here
    code = _run(args, config, mirrors, note)
    if world > 1:  # only the group init() joined: an in-process vLLM (--backend vllm) tears down its own at exit
        distributed.finish()  # not after an error: the other ranks may be inside a collective (torchrun stops them)
    return code


def _run(args: argparse.Namespace, config: RLConfig, mirrors, note: str | None) -> int:
    from bebop import distributed
    from bebop.rl.build import prepare_run

    # the world, --out opened (resumed: its checkpoint read), the backend, the task: before the policy loads
    run = prepare_run(config, args.out, resume=args.resume, mirrors=mirrors, name=args.name)
    distributed.barrier()  # every rank has checked --out before rank 0 writes to it
    head_spec = args.head if config.uses_head else None
    model, tokenizer, head, shadow = _load_heads(args.policy, head_spec, config)
    trainer = run.trainer(model, tokenizer, head=head, shadow_heads=shadow)
    if note and distributed.is_main():
        print(f"bebop rl: {note}", file=sys.stderr)  # the resume is under way: what its flags changed
    records = trainer.run(progress=not args.no_progress and distributed.is_main())
    if not distributed.is_main():
        return 0
    if records:
        print(closing_line(args.out, records, config, trainer.writer.meta))
    print(f"watch it: bebop dashboard --runs {args.out.parent}")
    return 0


def closing_line(out: Path, records: list[dict], config: RLConfig, meta: Mapping) -> str:
    """What `bebop rl` says at its end: the steps, the reward, the rollouts' accept length and γ (under auto, the
    mean depth the engine chose), the step time (`bebop.speedup.STATISTIC`) and what made the run."""
    from bebop.rl.compare import summarize
    from bebop.runlog.setup import head_of, policy_of

    summary, first, last = summarize(records), records[0], records[-1]
    decoding, made = "plain decoding", f"policy {policy_of(meta)}"
    if config.uses_head:
        length = summary.get("accept_length", math.nan)
        depth = f"γ {config.gamma}" + (f", mean {summary['gamma_mean']:.1f}" if "gamma_mean" in summary else "")
        decoding = (f"accept length {length:.2f}" if math.isfinite(length) else "nothing drafted") + f" ({depth})"
        made += f", head {head_of(meta)}"
    return (f"{out}: steps {first['step']}-{last['step']}, reward {first['critic/score/mean']:.3f} -> "
            f"{last['critic/score/mean']:.3f}, {decoding}, step time {summary['step_s']:.2f}s (median), {made}")


def _load_heads(policy, head_spec: str | None, config: RLConfig):
    """(model, tokenizer, the rollout head or None, {HEAD spec: head} of the shadow heads), loaded once each."""
    shadow = list(dict.fromkeys(spec.head for spec in parse_shadow_specs(config.shadow_heads)))
    if not shadow:
        model, tokenizer, head = load_policy(policy, head_spec)
        return model, tokenizer, head, {}
    specs = ([head_spec] if head_spec is not None else []) + shadow
    bundle = load_policy_heads(policy, [f"{i}={spec}" for i, spec in enumerate(specs)])  # labels apart by index
    heads = [bundle.heads[str(i)] for i in range(len(specs))]
    head = heads.pop(0) if head_spec is not None else None
    return bundle.model, bundle.tokenizer, head, dict(zip(shadow, heads))
