"""`bebop dashboard`: serve the live Streamlit dashboard over a runs root.

    bebop dashboard [--runs DIR] [--port N] [--host 127.0.0.1]
    bebop dashboard --reference           # the reference runs bebop ships (real RL runs), read where they lie

It runs `streamlit run` on the app shipped inside the package (`bebop/app/main.py`), so it works from a
pip install as well as from a clone, with flags fit for watching a job: bound to localhost unless told
otherwise, no browser opened, no usage statistics, and no file watcher (the watcher would otherwise
poll every file under the working directory, run directories included).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
from pathlib import Path

APP_SCRIPT = Path(__file__).resolve().parents[1] / "app" / "main.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=Path, default=None,
                        help="runs root to show (default: $BEBOP_RUNS, else ./runs)")
    parser.add_argument("--reference", action="store_true",
                        help="show the reference runs bebop ships (real RL runs with their provenance), read where "
                             "they lie, instead of a runs root")
    parser.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: only this machine can connect)")


def streamlit_command(args: argparse.Namespace, script: str | os.PathLike = APP_SCRIPT) -> list[str]:
    """The exact `streamlit run` command line `bebop dashboard` executes."""
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must lie in 1..65535, got {args.port}")
    if not args.host:
        raise ValueError("--host must not be empty")
    return [
        sys.executable, "-m", "streamlit", "run", os.fspath(script),
        "--server.port", str(args.port),
        "--server.address", args.host,
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "minimal",
    ]


def check_port(host: str, port: int) -> None:
    """Refuse a port another server listens on, before anything is printed: bind it as streamlit would (address
    reuse on, so a socket of a server that just stopped does not count) and let it go."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ValueError(f"--port {port}: cannot serve on {host}:{port} ({err.strerror or err}; another "
                             "dashboard?): pick another --port") from err


def runs_root(args: argparse.Namespace) -> Path:
    if args.reference:
        return _reference_root(args)
    root = args.runs if args.runs is not None else Path(os.environ.get("BEBOP_RUNS") or "runs")
    return root.expanduser().resolve()


def _reference_root(args: argparse.Namespace) -> Path:
    """The folder of the shipped reference runs (the app only reads: it never writes into a run directory)."""
    from bebop.runlog.reference import reference_root, reference_runs

    if args.runs is not None:
        raise ValueError("--reference and --runs name two roots: pass one of them")
    root = reference_root()
    if not reference_runs(root):
        raise FileNotFoundError(f"no reference run is shipped in {root}: docs/real-model-rl.md says how they are made")
    return root.resolve()


def run(args: argparse.Namespace) -> int:  # never returns: the process becomes streamlit
    if importlib.util.find_spec("streamlit") is None:
        raise ValueError("the dashboard needs streamlit: pip install 'bebop[app]' (or pip install streamlit)")
    command = streamlit_command(args)
    check_port(args.host, args.port)
    root = runs_root(args)
    print(f"bebop dashboard: {root} on http://{args.host}:{args.port}  (Ctrl-C stops)", flush=True)
    # exec, not a child process: Ctrl-C and kill reach streamlit itself, and no orphan server is left behind.
    os.execve(command[0], command, {**os.environ, "BEBOP_RUNS": str(root)})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bebop.commands.dashboard", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
