"""The compiled engine on a GPU (`Engine(compile=True)`: each step phase a CUDA graph): what the eager engine computes,
none of its graphs skipped, at T = 1 and at T = 0.7 with top-p, and one host sync per step. Skipped without CUDA;
`scripts/gpu-check` runs them as a stage of their own (they compile). tests/test_cuda_wiring.py runs the same code path
on the CPU: the graphs it compiles, capped, and no sampling float among their inputs."""

from __future__ import annotations

import pytest
import torch
from test_cuda_engine import (PROMPTS, SHAPE, _on_cuda, _random_pair, _same_run, _stopping_config,
                              check_one_host_sync_per_step)

from bebop.engine import Engine

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


# {name: (sampling, (gamma, method) runs)}. Each sampling setting compiles its own graphs (its floats are compiled in):
# T = 0.7 with top-p runs the speculative phases once, not every method again.
SETTINGS = {"T=1": ({}, ((0, "rs"), (3, "rs"), (3, "to"))),
            "T=0.7,top-p": ({"temperature": 0.7, "top_p": 0.9}, ((3, "rs"),))}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_cuda_graphs_compute_what_the_eager_engine_does(setting):
    """compile=True on CUDA: the step phases replay as CUDA graphs (none skipped: a sampling float left as a CPU input
    would skip them), over padded rows that compact as rows stop, and from the same seed emit the eager engine's
    tokens (fp32), twice in a row (graphs replayed)."""
    from torch._dynamo.utils import counters

    model, head = _on_cuda(_random_pair(SHAPE, seed=3))
    eager, graphed = Engine(model, head), Engine(model, head, compile=True)
    assert graphed.cudagraphs and graphed.buckets.padded
    counters.clear()
    sampling, runs = SETTINGS[setting]
    for gamma, method in runs:
        config = _stopping_config(eager, gamma, method, **sampling)
        want = eager.generate(PROMPTS, config)
        for _ in range(2):
            _same_run(graphed.generate(PROMPTS, config), want, 1e-4)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def test_one_host_sync_per_compiled_step():
    check_one_host_sync_per_step(compile=True)
