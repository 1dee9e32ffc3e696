"""A lint for CUDA calls that act on "the current device": each must name its device or stream.

`torch.cuda.synchronize()`, `Event().record()`, `current_stream()` and the memory counters act on the calling
thread's current device, which is not the tensor's when a job runs on `--device cuda:N` (N != 0) or in a thread
that never set it (the async rollout thread; torchrun ranks >= 1 before `set_device`). The code is then silently
wrong: an event recorded on a stream the copy never ran on, a peak read off another GPU. No CPU run can see it, so
the sources say it instead: bebop/ and scripts/ name a device or stream in every such call.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# torch.cuda functions whose first argument (or `device=`) says which device they act on; None = the current one.
DEVICE_ARGUMENT = {"synchronize", "current_stream", "default_stream", "memory_allocated", "max_memory_allocated",
                   "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
                   "memory_stats", "mem_get_info", "Stream"}


def _dotted(node: ast.AST) -> str:
    """`torch.cuda.synchronize` for an attribute chain, '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def current_device_calls(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: call' for each CUDA call in `source` that acts on the current device because it names none."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        bare = not node.args and not any(k.arg in ("device", "stream") for k in node.keywords)
        name = _dotted(node.func)
        on_cuda = name.startswith(("torch.cuda.", "cuda.")) and node.func.attr in DEVICE_ARGUMENT
        # An event's record() with no stream records on the current device's stream.
        if bare and (on_cuda or node.func.attr == "record"):
            found.append(f"{filename}:{node.lineno}: {name or node.func.attr}()")
    return found


def _python_sources() -> list[Path]:
    scripts = [p for p in (ROOT / "scripts").iterdir() if p.is_file()
               and (p.suffix == ".py" or p.read_text(errors="replace").startswith("#!/usr/bin/env python"))]
    return sorted(ROOT.glob("bebop/**/*.py")) + scripts


def test_the_lint_flags_each_kind_of_current_device_call():
    planted = "\n".join(["import torch", "torch.cuda.synchronize()", "torch.cuda.Event().record()",
                         "s = torch.cuda.current_stream()", "torch.cuda.max_memory_allocated()",
                         "torch.cuda.reset_peak_memory_stats()", "from torch import cuda", "cuda.memory_allocated()"])
    assert [f.split(": ", 1)[1] for f in current_device_calls(planted)] == [
        "torch.cuda.synchronize()", "record()", "torch.cuda.current_stream()", "torch.cuda.max_memory_allocated()",
        "torch.cuda.reset_peak_memory_stats()", "cuda.memory_allocated()"]
    named = "\n".join(["import torch", "torch.cuda.synchronize(t.device)", "e.record(torch.cuda.current_stream(d))",
                       "torch.cuda.max_memory_allocated(device=d)", "torch.cuda.is_available()"])
    assert current_device_calls(named) == []


def test_bebop_and_scripts_name_the_device_of_every_cuda_call():
    sources = _python_sources()
    assert ROOT / "bebop" / "engine" / "transfer.py" in sources and ROOT / "scripts" / "gpu-check" in sources
    found = [f for path in sources for f in current_device_calls(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], "\n".join(found)
