"""bebop: MTP speculative decoding for RL post-training of LLMs (`bebop COMMAND --help` for each command)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import shlex
import signal
import sys
import threading
from pathlib import Path

from bebop.checks import FIELD_FLAGS

# A subcommand's module is imported only when that subcommand runs, so `bebop --help` stays instant.

# name -> (module, help). Each module exposes add_arguments(parser) and run(args) -> int | None.
COMMANDS = {
    "demo": ("bebop.commands.demo", "the README's main job: a short end-to-end demonstration"),
    "dashboard": ("bebop.commands.dashboard", "serve the live Streamlit dashboard over a runs root"),
    "preview": ("bebop.commands.preview", "synthetic runs to look at in the dashboard before any real job"),
    "rl": ("bebop.commands.rl", "GRPO RL with plain, TO or RS rollouts and frozen or online MTP heads"),
    "pretrain": ("bebop.commands.pretrain", "train the tiny policy on task demonstrations (the embedded default)"),
    "train-mtp": ("bebop.commands.train_mtp", "pre-RL MTP head training on a frozen policy with one of the five losses"),
    "eval-mtp": ("bebop.commands.eval_mtp", "acceptance of MTP heads by method, temperature and task (Table 2, entropy law)"),
    "task-sweep": ("bebop.commands.task_sweep",
                   "a policy's start reward on reasoning-gym tasks across difficulty settings (needs bebop[gym])"),
    "get-model": ("bebop.commands.get_model",
                  "a real pretrained model (smollm2, or any .gguf file) as a local checkpoint, converted once, offline"),
    "make-checkpoint": ("bebop.commands.make_checkpoint",
                        "a small random-init Qwen3/Qwen2/Llama checkpoint with a BPE chat tokenizer, made offline"),
}
BENCHMARKS = {
    "losses": ("bebop.commands.bench.losses", "tiled vs plain full-vocabulary TV loss: peak memory and time"),
    "engine": ("bebop.commands.bench.engine", "tokens/s of plain, TO and RS decoding against Hugging Face generate()"),
    "step": ("bebop.commands.bench.step", "one engine step split into its phases, plain beside speculative, and "
             "where the speedup departs from the cost model's"),
    "rl": ("bebop.commands.bench.rl", "RL step time with and without MTP+RS rollouts, sync and async"),
    "depth": ("bebop.commands.bench.depth",
              "the draft depth chosen live (--gamma auto) beside every static depth on a task's prompts"),
    "train-mtp": ("bebop.commands.bench.train_mtp",
                  "one train-mtp step at a real vocabulary: dense logits, chunked hidden states and draft vocabularies, "
                  "peak memory and time"),
    "memory": ("bebop.commands.bench.memory", "the peak resident memory of whole bebop jobs, each in a fresh process"),
    "corpus": ("bebop.commands.bench.corpus",
               "answers per minute of train-mtp's corpus generation: plain sampling beside drafting with a head (RS)"),
    "coverage": ("bebop.commands.bench.coverage",
                 "the soft coverage p(S) of draft vocabularies of K ids on the policy's own samples"),
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (not the usage first) with the way to the command's help."""

    def error(self, message: str):
        self.exit(2, f"bebop: error: {self.prog.removeprefix('bebop ')}: {message} (see {self.prog} --help)\n")


def _add(subparsers, name: str, module: str, help_text: str) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    mod = importlib.import_module(module)
    mod.add_arguments(parser)
    parser.set_defaults(_run=mod.run, _parser=parser)


def _flag(parser: argparse.ArgumentParser, field: str) -> str | None:
    """The command line's name for a config field (`--batch-size` for batch_size), None where no flag sets it."""
    dest = FIELD_FLAGS.get(field, field)
    return next((a.option_strings[0] for a in parser._actions if a.dest == dest and a.option_strings), None)


def in_flags(message: str, parser: argparse.ArgumentParser) -> str:
    """A config's error as the command line's user reads it: config fields named by their flags ("RLConfig.steps",
    and "lr" where the message opens with the field, become "--steps", "--lr"). Fields no flag sets keep their
    names. (A run directory's refusal names its flag itself: `bebop.runlog.write.check_run_dir`.)"""
    message = re.sub(r"\b[A-Z]\w*Config\.(\w+)", lambda m: _flag(parser, m.group(1)) or m.group(0), message)
    head, sep, tail = message.partition(" must ")
    if sep:
        head = re.sub(r"(?<![-\w.])([a-z]\w*)\b", lambda m: _flag(parser, m.group(1)) or m.group(0), head)
        message = head + sep + tail
    return message


def _unknown_command(argv: list[str]) -> str | None:
    """One line for a command that does not exist, with the closest one ("did you mean"); None when it exists."""
    if not argv or argv[0].startswith("-"):
        return None
    known, name, where = [*COMMANDS, "bench"], argv[0], "command"
    if name == "bench" and len(argv) > 1 and not argv[1].startswith("-"):
        known, name, where = list(BENCHMARKS), argv[1], "benchmark"
    if name in known:
        return None
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f"; the {where}s: {', '.join(known)}"
    return f"bebop: error: unknown {where} '{name}'{hint}"


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = Parser(prog="bebop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = argv[0] if argv else None
    for name, (module, help_text) in COMMANDS.items():
        if wanted == name:
            _add(sub, name, module, help_text)
        else:
            sub.add_parser(name, help=help_text)
    bench = sub.add_parser("bench", help="benchmarks that print ratios measured side by side in one run")
    bench_sub = bench.add_subparsers(dest="benchmark", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        if wanted == "bench" and len(argv) > 1 and argv[1] == name:
            _add(bench_sub, name, module, help_text)
        else:
            bench_sub.add_parser(name, help=help_text)
    return parser


def given_dests(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the flags `argv` gives `parser` (parsed again with every default suppressed): what a job's
    `--resume` holds against the run's record (`bebop.commands.flags.given`)."""
    actions = [(action, action.default) for action in parser._actions]
    defaults = dict(parser._defaults)
    try:
        for action, _ in actions:
            action.default = argparse.SUPPRESS
        parser._defaults.clear()
        return set(vars(parser.parse_args(argv)))
    finally:
        for action, default in actions:
            action.default = default
        parser._defaults.update(defaults)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a job as Ctrl-C does: its run is closed "interrupted", resumable


def resume_command(argv: list[str], args: argparse.Namespace) -> str | None:
    """The command that continues an interrupted job: the same one with --resume (and the run directory it chose,
    where it named its own); None for a job that cannot resume, or one stopped before its run was written."""
    dests = {a.dest for a in args._parser._actions}
    run_dir = getattr(args, "run_dir" if "run_dir" in dests else "out", None)
    if "resume" not in dests or run_dir is None or not (Path(run_dir) / "meta.json").is_file():
        return None
    words = [*argv, *([] if "--resume" in argv else ["--resume"])]
    if "run_dir" in dests and "--run-dir" not in argv:
        words += ["--run-dir", str(run_dir)]
    return shlex.join(["bebop", *words])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if (unknown := _unknown_command(argv)) is not None:
        print(unknown, file=sys.stderr)
        return 2
    args = build_parser(argv).parse_args(argv)
    args._given = given_dests(args._parser, argv[2 if argv[0] == "bench" else 1:])
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(args._run(args) or 0)
    # Bad input, found by the job's own checks before any heavy work: one line and exit 2, as argparse does.
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError) as err:
        print(f"bebop: error: {in_flags(str(err), args._parser)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        again = resume_command(argv, args)
        print("\nbebop: interrupted" + (f"; the run is marked interrupted: continue it with\n  {again}" if again
                                        else ""), file=sys.stderr)
        return 130
