"""The CUDA-graph engine's code path, run on the CPU: what a GPU run would compile, counted before any GPU is lent.

`Engine(compile=True)` on a CUDA device pads rows into buckets, pools static caches and compiles each step phase
into CUDA graphs (bebop.engine.generate). Here that configuration is built as on CUDA (the engine is told its
device is "cuda" while it sets up), and `torch.compile` is swapped for a backend that records each graph it is
handed and runs it eagerly. So on any CPU:

  * tokens equal the eager engine's, from the same seed, over a scaled-down mix of the bench's batch sizes (a lone
    row, and rows padded into larger buckets that compact as rows stop);
  * the graphs per step phase are capped: one per phase for one method and sampling setting, whatever the batch
    size or cache length (a guard that splits them, e.g. on a batch of 1 or a kv_len equal to the cache's length,
    multiplies the minutes a GPU spends compiling);
  * no sampling float enters a graph as an input (at T = 0.7, top-p 0.9): dynamic shapes would make it a CPU scalar
    tensor, and inductor does not replay a graph with a CPU input as a CUDA graph.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from test_engine import _random_pair

from bebop.engine import Engine
from bebop.engine.buckets import Buckets
from bebop.engine.rollout import GenerationConfig
from bebop.models.config import ModelConfig

SHAPE = ModelConfig.tiny(vocab_size=64, num_hidden_layers=1)
STEP_PHASES = ("draft", "verify_rows", "catch_up")


def _emulated_cuda_engine(monkeypatch, model, head) -> tuple[Engine, dict[str, list[list]]]:
    """An engine configured as `Engine(model, head, compile=True)` on CUDA, and {function name: [graph inputs]}
    filled in as its graphs are compiled."""
    graphs: dict[str, list[list]] = defaultdict(list)
    compile_ = torch.compile

    def recording_compile(fn, *, dynamic=None, mode=None, options=None):
        def backend(gm, example_inputs):
            graphs[fn.__name__].append(list(example_inputs))
            return gm.forward
        return compile_(fn, dynamic=dynamic, backend=backend)

    monkeypatch.setattr(torch, "compile", recording_compile)
    torch._dynamo.reset()  # graphs other tests compiled for these functions would not be counted
    with monkeypatch.context() as m:
        m.setattr(Engine, "device", property(lambda self: torch.device("cuda")))
        engine = Engine(model, head, compile=True)
    assert engine.cudagraphs and engine.buckets == Buckets() and engine.pool.static
    return engine, graphs


def _float_inputs(graphs: dict[str, list[list]], names=STEP_PHASES) -> list[str]:
    """The inputs of the graphs of `names` that carry a Python float: a SymFloat or float, or a 0-d floating tensor
    (a wrapped scalar). Only the step phases are CUDA graphs; the prefill's forwards may take their floats so."""
    return [f"{name}: {x!r}" for name in names for inputs in graphs.get(name, []) for x in inputs
            if isinstance(x, (float, torch.SymFloat))
            or (isinstance(x, torch.Tensor) and x.dim() == 0 and x.is_floating_point())]


@pytest.mark.slow
def test_the_cuda_graph_engine_path_on_cpu_caps_its_graphs_and_matches_eager(monkeypatch):
    model, head = _random_pair(SHAPE, seed=3)
    eager = Engine(model, head)
    graphed, graphs = _emulated_cuda_engine(monkeypatch, model, head)
    gen = torch.Generator().manual_seed(0)
    # Rows of up to 8 + 60 + 4 tokens: the attended slots grow past one kv_multiple (64) of the cache.
    config = GenerationConfig(max_new_tokens=60, gamma=3, method="rs", temperature=0.7, top_p=0.9, seed=5)
    for rows in (1, 3, 5):  # the bench's batches 1 8 32 64, scaled down: buckets 2, 4 and 8
        prompts = [torch.randint(1, 64, (int(n),), generator=gen).tolist() for n in torch.randint(2, 9, (rows,))]
        free = eager.generate(prompts, config)
        stopping = GenerationConfig(**{**config.__dict__, "stop_tokens": (free.tokens[0][4],)})  # rows stop apart
        runs = [(config, free)] + ([(stopping, eager.generate(prompts, stopping))] if rows > 1 else [])
        for cfg, want in runs:
            got = graphed.generate(prompts, cfg)
            assert got.tokens == want.tokens and got.origin == want.origin, (rows, cfg.stop_tokens)
            torch.testing.assert_close(torch.tensor(sum(got.logprobs, [])), torch.tensor(sum(want.logprobs, [])),
                                       atol=1e-5, rtol=0)
    counts = {name: len(calls) for name, calls in graphs.items()}
    assert {name: counts.get(name) for name in STEP_PHASES} == dict.fromkeys(STEP_PHASES, 1), counts
    # Prefill is not graphed; its forwards see a lone fed row (a size of 1) and several; the head's also one position
    # per row after a prompt rows share (`Engine._feed`: a width of 1).
    assert counts["forward"] <= 2 and counts["forward_cached"] <= 3, counts
    assert _float_inputs(graphs) == []


def test_the_float_check_sees_a_wrapped_sampling_float():
    """The check above can fail: a function compiled with its temperature left symbolic gets it as an input."""
    graphs: dict[str, list[list]] = defaultdict(list)

    def backend(gm, example_inputs):
        graphs["scale"].append(list(example_inputs))
        return gm.forward

    @torch.compile(dynamic=True, backend=backend)
    def scale(x, temperature: float):
        return x / temperature

    torch._dynamo.reset()
    with torch._dynamo.config.patch(specialize_float=False):
        scale(torch.ones(3), 0.7)
    assert _float_inputs(graphs, ["scale"]) != []
