"""`bebop preview ROOT`: synthetic RL runs to look at in the dashboard before any real job (bebop.rl.synthetic), and
beside them a copy of each reference run bebop ships (real RL runs: bebop.runlog.reference) under ROOT/reference/.

    bebop preview runs/preview                  # five finished runs of the paper's comparisons, and the reference runs
    bebop preview runs/preview --live 1         # ... plus one that grows by a step every second, until Ctrl-C
    bebop preview runs/preview --no-reference   # the synthetic runs alone
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import replace
from pathlib import Path

REFERENCE = "reference"  # ROOT's folder for the copies of the reference runs: apart from the synthetic runs' names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", type=Path, help="directory to write the runs into (one sub-directory per run)")
    parser.add_argument("--steps", type=int, default=60, help="steps per finished run (default 60)")
    parser.add_argument("--live", type=float, default=None, metavar="SECONDS",
                        help="also write a run 'live' that grows by one step every SECONDS until interrupted")
    parser.add_argument("--live-steps", type=int, default=100_000,
                        help="stop the live run after this many steps (default: %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="replace the preview runs already in ROOT (its synthetic runs and its copies of the "
                             "reference runs: a run of yours is never replaced)")
    parser.add_argument("--no-reference", action="store_true",
                        help=f"leave out the reference runs bebop ships (real RL runs, copied into ROOT/{REFERENCE}/)")


def _is_preview_run(run_dir: Path) -> bool:
    """A run a preview wrote: a synthetic one, or a copy of a reference run (which carries its provenance.json)."""
    from bebop.files import read_json
    from bebop.runlog.reference import is_reference_run

    try:
        return bool(read_json(run_dir / "meta.json").get("synthetic")) or is_reference_run(run_dir)
    except (OSError, ValueError):
        return False


def clear_targets(targets: list[Path], *, force: bool) -> None:
    """Make room for the preview's runs, or refuse with one line: a target in use is refused without --force, and a
    target that is not a preview's run is refused even with it (a preview never replaces a run of yours)."""
    used = [path for path in targets if path.exists() and (not path.is_dir() or any(path.iterdir()))]
    real = [path for path in used if not _is_preview_run(path)]
    if real:
        what = "exists and is not a preview run" if len(real) == 1 else "exist and are not preview runs"
        raise FileExistsError(f"{', '.join(str(p) for p in real)} {what}: choose another ROOT (a preview never "
                              "replaces a real run)")
    if used and not force:
        raise FileExistsError(f"{', '.join(str(p) for p in used)} already hold preview runs: pass --force to "
                              "replace them, or choose another ROOT")
    for path in used:
        shutil.rmtree(path)


def real_runs(root: Path) -> list[str]:
    """The runs under `root` that no preview wrote (what a preview would sit beside)."""
    if not root.is_dir():
        return []
    from bebop.runlog import list_runs

    return [info.path.relative_to(root).as_posix() for info in list_runs(root) if not _is_preview_run(info.path)]


def run(args: argparse.Namespace) -> int:
    if args.steps < 2 or args.live_steps < 2:
        raise ValueError(f"--steps and --live-steps must be >= 2, got {args.steps} and {args.live_steps}")
    if args.live is not None and not args.live >= 0:
        raise ValueError(f"--live must be a number of seconds >= 0, got {args.live}")
    from bebop.rl.synthetic import SyntheticRun, preview_configs, write_preview_runs
    from bebop.runlog.reference import copy_reference_runs, reference_runs

    references = {} if args.no_reference else reference_runs()
    targets = [args.root / config.name for config in preview_configs(args.steps)]
    targets += [args.root / "live"] if args.live is not None else []
    targets += [args.root / REFERENCE / name for name in references]
    clear_targets(targets, force=args.force)  # before anything is written: a refusal leaves ROOT as it was
    others = real_runs(args.root)
    paths = write_preview_runs(args.root, args.steps)
    print("wrote", ", ".join(str(p) for p in paths))
    if references:
        copies = copy_reference_runs(references, args.root / REFERENCE)
        print("copied the reference runs bebop ships (real RL runs, not synthetic):", ", ".join(str(p) for p in copies))
    if others:
        print(f"note: {args.root} also holds {len(others)} real run(s) ({', '.join(others[:3])}"
              f"{', ...' if len(others) > 3 else ''}); the dashboard marks the preview's as synthetic")
    print(f"open them: bebop dashboard --runs {args.root}   (synthetic runs are marked as such"
          + (" and, beside the real ones, shown only when picked in the sidebar)" if references or others else ")"))
    if args.live is None:
        return 0
    config = replace(preview_configs(args.live_steps)[3], name="live", seed=7)
    with SyntheticRun(args.root / "live", config) as run:
        print(f"growing {run.path} by one step every {args.live} s (Ctrl-C stops)", flush=True)
        try:
            while run.step < args.live_steps:
                run.advance()
                time.sleep(args.live)
        except KeyboardInterrupt:
            pass
    return 0
