"""Batched plain and speculative generation with an MTP draft head.

One loop serves plain decoding (gamma = 0) and speculative decoding, so comparisons are fair.
Per speculative step, for every active row at once:

  1. draft    gamma tokens from the MTP head (sampled from q for "rs", argmax q for "to"/"greedy")
  2. verify   one target forward over [pending token, drafts] (gamma + 1 positions), then `bebop.verify`
  3. sync     ONE device->host transfer: accepted counts, emitted tokens, their log-probs and entropies
  4. retire   rows that hit a stop token or string or their budget leave the batch (the long tail shrinks it)
  5. advance  each row's KV cache by its own accepted count + 1, and catch the head's cache up on the
              accepted tokens; the same forward yields the next step-1 draft

The device work of 1, 2 and 5 is `bebop.engine.step` (draft, verify_rows, catch_up), eager or compiled, which also owns
the layouts shared with this module: the step's uniforms (`draw_uniforms`, from the engine's generator) and the
host table (`unpack_host_row`). This module keeps the host side: the generator, the sync, the bookkeeping of rows.

State between steps: the target cache holds positions 0..L-1 of a row, `pending` is the token at L (sampled,
not yet in the cache), and the head's cache is valid up to L-1, where its last entry is the step-1 draft query
f(h_{L-1}, y_L). Stale cache slots past a row's length are overwritten later, never read.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from bebop.engine.rollout import Decode, Env, GenerationConfig, Rollout, RolloutBuilder
from bebop.engine.step import StepRow, catch_up, draft, draw_uniforms, unpack_host_row, verify_rows
from bebop.metrics import SpecCounters, derive, entropy
from bebop.models.kvcache import KVCache
from bebop.models.mtp import check_head_fits
from bebop.models.prepack import prepacked
from bebop.sampling import probs_from_logits, sample


@dataclass
class _Batch:
    """The active rows of a generation and their device state."""

    rows: list[int]  # original prompt index of each active row
    lengths: list[int]  # host copy of the target cache length per row (bounds checks without a sync)
    pending: torch.Tensor  # [B] the token at position `lengths`, not yet in the target cache
    cache: KVCache
    draft_cache: KVCache | None = None
    draft_logits: torch.Tensor | None = None  # [B, V] the head's step-1 logits for the next draft
    draft_hidden: torch.Tensor | None = None  # [B, 1, d] the head's step-1 output hidden

    def keep(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.pending.device)
        self.rows = [self.rows[i] for i in keep]
        self.lengths = [self.lengths[i] for i in keep]
        self.pending = self.pending[index]
        self.cache.keep(index)
        if self.draft_cache is not None:
            self.draft_cache.keep(index)
            self.draft_logits, self.draft_hidden = self.draft_logits[index], self.draft_hidden[index]


def _pad(feeds: list[tuple[int, int, list[int]]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The feeds' token runs right-padded with 0 [F, W], their start positions [F] and last indices [F]."""
    tokens = torch.zeros(len(feeds), max(len(t) for _, _, t in feeds), dtype=torch.long)
    for r, (_, _, feed) in enumerate(feeds):
        tokens[r, : len(feed)] = torch.as_tensor(feed, dtype=torch.long)
    starts = torch.tensor([s for _, s, _ in feeds], device=device)
    last = torch.tensor([len(t) - 1 for _, _, t in feeds], device=device)
    return tokens.to(device), starts, last


@contextmanager
def _rows_of(cache: KVCache, index: torch.Tensor, whole: bool) -> Iterator[KVCache]:
    """Rows `index` of `cache` to write into: the cache itself when they are all of it, else a copy of them that is
    written back at the end of the block."""
    sub = cache if whole else cache.select(index)
    yield sub
    if not whole:
        cache.assign(index, sub)


class Engine:
    """Generation for a target `model` with an optional MTP draft head `mtp`.

    compile=True runs each phase of a decoding step (bebop.engine.step: the draft loop, the verification forward with its
    sampling and per-token statistics, the head's catch-up) and the prefill forwards as `torch.compile` graphs with
    dynamic shapes (on CPU with inductor's C++ wrapper): a few graphs per phase serve every batch size, cache
    length, prompt width and gamma (torch specialises sizes 0 and 1, so batch 1 and plain steps get their own).
    The first steps pay the compilation (cached on disk by inductor for later processes; its cost is in README's
    Benchmarks): worth it for long generation, not for a few short calls. After that a step's hundreds of small ops
    run as a few fused kernels, which on CPU is most of a small model's step time. The randomness comes in as
    uniforms drawn from the engine's generator, so from the same seed the compiled engine draws what the eager one
    draws. Parameters stay graph inputs (no freezing), so a policy that an optimiser updates in place is sampled
    as updated.
    """

    def __init__(self, model: torch.nn.Module, mtp: torch.nn.Module | None = None, *, compile: bool = False):
        self.model, self.mtp, self.compiled = model, mtp, compile
        self.config = model.config
        if mtp is not None:
            check_head_fits(mtp.config, self.config)
        if compile:
            # Dynamo's recompile limit (8) counts per code object, over every model a process compiles: two
            # models' graphs of Transformer.forward would exhaust it and silently fall back to eager.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        # On CPU the generated Python wrapper that calls a graph's few dozen kernels costs about as much as the
        # small kernels themselves; a C++ wrapper (the same kernels) measured faster plain steps, most at batch 1,
        # and compiles no slower (README, Benchmarks).
        options = {"cpp_wrapper": True} if self.device.type == "cpu" else None
        wrap = (lambda fn: torch.compile(fn, dynamic=True, options=options)) if compile else (lambda fn: fn)
        # The cached forwards (prefill, step costs), compiled or not: model.forward and mtp.forward_cached.
        self.target_step = wrap(model.forward)
        self.head_step = None if mtp is None else wrap(mtp.forward_cached)
        # A decoding step's device work (bebop.engine.step), each phase one graph when compiled.
        self.draft_step, self.verify_step, self.catch_up_step = wrap(draft), wrap(verify_rows), wrap(catch_up)

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    def packed_weights(self):
        """The context generate() runs in: eagerly on CPU in bf16, linear weights packed for oneDNN once per
        weight version instead of on every matmul (bebop.models.prepack; measured faster steps: README, Benchmarks)."""
        return prepacked(self.model, self.mtp, enabled=not self.compiled)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], config: GenerationConfig, *, env: Env | None = None,
                 decode: Decode | None = None) -> Rollout:
        """Complete every prompt. With `env`, a row that emits a stop token (or completes a stop string) gets
        env(row, tokens)'s reply appended (origin "env") and continues from its cached prefix; a None reply ends
        the row. `decode` (the tokenizer's) is needed only for `config.stop_strings`."""
        self._check(prompts, config)
        generator = torch.Generator(device=self.device)
        # Not torch.seed(): that reseeds the global generator with OS entropy, behind the caller's back.
        seed = config.seed if config.seed is not None else int(torch.randint(2**62, ()))
        generator.manual_seed(seed)
        verdicts: list[list[float]] = []  # per verified row: [num_accepted, H(p_1..p_γ)], counted once at the end
        timing = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "advance": 0.0}
        out = RolloutBuilder(len(prompts), config, env, self.config.vocab_size, decode)
        start = time.perf_counter()
        with self.packed_weights():
            batch = self._new_batch(prompts, config)
            self._settle(batch, [(i, 0, list(p)) for i, p in enumerate(prompts)], config, generator, out)
            timing["prefill"] = time.perf_counter() - start
            steps = 0
            while batch.rows:
                steps += 1
                self._step(batch, config, generator, out, verdicts, timing)
        wall = time.perf_counter() - start
        return out.build(self._stats(out, verdicts, timing, wall, steps, config))

    # ----------------------------------------------------------------------------------------------
    def _check(self, prompts: list[list[int]], config: GenerationConfig) -> None:
        if not prompts:
            raise ValueError("prompts is empty: pass at least one prompt")
        vocab = self.config.vocab_size
        for i, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
            bad = [t for t in prompt if not 0 <= int(t) < vocab]
            if bad:
                raise ValueError(f"prompts[{i}] has token ids out of range [0, {vocab}): {bad[:5]}")
        if config.vocab_limit is not None and config.vocab_limit > vocab:
            raise ValueError(f"vocab_limit={config.vocab_limit} exceeds the model's vocabulary of {vocab} ids")
        if any(not 0 <= t < vocab for t in config.stop_tokens):
            raise ValueError(f"stop_tokens has ids out of range [0, {vocab}): {config.stop_tokens}")
        need = max(len(p) for p in prompts) + config.max_new_tokens + config.gamma + 1
        if need > self.config.max_position_embeddings:
            raise ValueError(
                f"longest prompt + max_new_tokens + gamma + 1 = {need} exceeds the model's "
                f"max_position_embeddings={self.config.max_position_embeddings}"
            )
        if config.gamma > 0 and self.mtp is None:
            raise ValueError(f"method {config.method!r} with gamma={config.gamma} needs an MTP head; "
                             "pass Engine(model, mtp) or use gamma=0 for plain decoding")
        depth = getattr(self.mtp, "trained_depth", None)
        if config.gamma > 0 and depth is not None and config.gamma > depth:
            warnings.warn(f"gamma={config.gamma} exceeds the head's trained depth {depth}: "
                          "acceptance at the extra positions is untrained", stacklevel=3)

    def _probs(self, logits: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
        return probs_from_logits(logits, *config.sampling)

    def _sync(self, config: GenerationConfig) -> None:
        if config.profile and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _new_batch(self, prompts: list[list[int]], config: GenerationConfig) -> _Batch:
        n, device = len(prompts), self.device
        max_len = max(len(p) for p in prompts) + config.max_new_tokens + config.gamma + 1
        batch = _Batch(list(range(n)), [0] * n, torch.zeros(n, dtype=torch.long, device=device),
                       self.model.new_cache(n, max_len))
        if config.gamma > 0:
            batch.draft_cache = self.mtp.new_cache(n, max_len)
            batch.draft_hidden = torch.zeros(n, 1, self.config.hidden_size, dtype=batch.cache.dtype, device=device)
            batch.draft_logits = torch.zeros(n, self.config.vocab_size, dtype=batch.cache.dtype, device=device)
        return batch

    def _feed(self, batch: _Batch, feeds: list[tuple[int, int, list[int]]], config, generator) -> list[list[float]]:
        """Prefill token runs into some rows and sample each row's next token from the target.

        feeds: (row in batch, start position, tokens) — a prompt at 0, or [stop token, env reply...] where a row
        parked. Those rows' caches get the tokens at start.., their pending token becomes the sample, and the
        head's cache is caught up so its step-1 draft is ready. Returns [token, logprob, entropy] per feed."""
        index = torch.tensor([i for i, _, _ in feeds], dtype=torch.long, device=self.device)  # [F]
        tokens, starts, last = _pad(feeds, self.device)  # [F, W], [F], [F]
        rows = torch.arange(len(feeds), device=self.device)  # [F]
        kv_len = max(s for _, s, _ in feeds) + tokens.shape[1]
        whole = [i for i, _, _ in feeds] == list(range(len(batch.rows)))  # e.g. prefill: no sub-cache copies
        for cache in (batch.cache, batch.draft_cache):
            if cache is not None:
                cache.grow(kv_len)
        with _rows_of(batch.cache, index, whole) as cache:
            cache.lengths.copy_(starts)
            _, hidden = self.target_step(tokens, cache, kv_len=kv_len, compute_logits=False)  # [F, W, d]
            target_probs = self._probs(self.model.lm_logits(hidden[rows, last]), config)  # [F, V]
            token = sample(target_probs, generator)  # [F]
            cache.lengths += last + 1
        if config.gamma > 0:
            # The head's entry at position i pairs h_i with token i+1; the last one is the step-1 draft query.
            next_tokens = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)  # [F, W]
            next_tokens[rows, last] = token
            with _rows_of(batch.draft_cache, index, whole) as draft_cache:
                draft_cache.lengths.copy_(starts)
                _, draft_hidden = self.head_step(self.model, hidden, next_tokens, draft_cache,
                                                 kv_len=kv_len, compute_logits=False)  # [F, W, d]
                draft_cache.lengths += last + 1
            batch.draft_hidden[index] = draft_hidden[rows, last][:, None]  # [F, 1, d]
            batch.draft_logits[index] = self.mtp.logits(self.model, batch.draft_hidden[index])[:, 0]  # [F, V]
        batch.pending[index] = token
        for (i, s, feed) in feeds:
            batch.lengths[i] = s + len(feed)
        logp = target_probs.gather(-1, token[:, None])[:, 0].log()  # [F]
        return torch.stack([token.double(), logp.double(), entropy(target_probs).double()], 1).tolist()  # HOST SYNC

    def _settle(self, batch: _Batch, feeds, config, generator, out: RolloutBuilder) -> None:
        """Feed, then keep feeding rows whose first sampled token was a stop the env replied to; drop finished rows."""
        done = set()
        while feeds:
            results = self._feed(batch, feeds, config, generator)
            parked = []
            for (i, _, _), (token, logp, ent) in zip(feeds, results):
                state, _, reply = out.append(batch.rows[i], [int(token)], [logp], [ent], ["plain"])
                if state == "done":
                    done.add(i)
                elif state == "park":  # the sampled stop token is pending (not cached): feed it with the reply
                    parked.append((i, batch.lengths[i], [int(token), *reply]))
            feeds = parked
        if done:
            batch.keep([i for i in range(len(batch.rows)) if i not in done])

    def _step(self, batch: _Batch, config, generator, out: RolloutBuilder, verdicts: list, timing) -> None:
        gamma, sampling = config.gamma, config.sampling
        kv_len = max(batch.lengths) + gamma + 1
        t0 = time.perf_counter()
        uniforms = draw_uniforms(len(batch.rows), gamma, config.method, generator, self.device)  # [B, n]
        # 1. draft
        if gamma > 0:
            draft_tokens, draft_probs = self.draft_step(
                self.model, self.mtp, batch.draft_logits, batch.draft_hidden, batch.draft_cache, uniforms,
                kv_len=kv_len - 1, gamma=gamma, method=config.method, sampling=sampling)  # [B, γ], [B, γ, V] | None
        else:
            draft_tokens, draft_probs = torch.empty(len(batch.rows), 0, dtype=torch.long, device=self.device), None
        self._sync(config)
        t1 = time.perf_counter()
        # 2. verify: one target forward over the pending token and the drafts
        host, num_accepted, next_token, emitted, hidden = self.verify_step(
            self.model, batch.pending, draft_tokens, draft_probs, batch.cache, uniforms, kv_len=kv_len,
            method=config.method, sampling=sampling)
        self._sync(config)
        t2 = time.perf_counter()
        # 3. sync: the one device->host copy per step
        results = [unpack_host_row(row, gamma) for row in host.tolist()]  # HOST SYNC
        if gamma > 0:
            verdicts += [[r.num_accepted, *r.verified_entropies] for r in results]
        # 4. retire finished rows; rows whose stop token got an env reply are parked for a feed
        keep, parked = self._retire(batch, results, gamma, out)
        # 5. advance the survivors
        if len(keep) < len(batch.rows):
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            num_accepted, next_token, emitted, hidden = (x[index] for x in (num_accepted, next_token, emitted, hidden))
            batch.keep(keep)
        if batch.rows:
            accepted_host = [results[i].num_accepted for i in keep]
            self._advance(batch, num_accepted, accepted_host, next_token, emitted, hidden, config)
        if parked:
            self._settle(batch, parked, config, generator, out)
        self._sync(config)
        t3 = time.perf_counter()
        timing["draft"] += t1 - t0
        timing["verify"] += t2 - t1
        timing["advance"] += t3 - t2

    def _retire(self, batch: _Batch, results: list[StepRow], gamma: int,
                out: RolloutBuilder) -> tuple[list[int], list[tuple[int, int, list[int]]]]:
        """Append each row's emitted tokens to `out`. Returns the rows that go on (indices into the batch) and the
        parked rows' feeds for `_settle`: (index among the kept rows, start position, [stop token, env reply...])."""
        keep, parked = [], []
        for i, r in enumerate(results):
            n = r.num_accepted
            origins = ["plain"] if gamma == 0 else ["accepted"] * n + ["recovered" if n < gamma else "bonus"]
            state, stop_at, reply = out.append(batch.rows[i], r.tokens, r.logprobs, r.entropies, origins)
            if state != "done":
                keep.append(i)
            if state == "park":  # cache through the token before the stop; feed [stop, reply...] from there
                parked.append((len(keep) - 1, batch.lengths[i] + stop_at + 1, [r.tokens[stop_at], *reply]))
        return keep, parked

    def _advance(self, batch: _Batch, num_accepted, accepted_host: list[int], next_token, emitted, hidden,
                 config) -> None:
        if config.gamma > 0:
            batch.draft_hidden, batch.draft_logits = self.catch_up_step(
                self.model, self.mtp, hidden, emitted, num_accepted, batch.cache, batch.draft_cache,
                kv_len=max(batch.lengths) + config.gamma + 1)
        else:
            batch.cache.lengths += num_accepted + 1
        batch.lengths = [length + n + 1 for length, n in zip(batch.lengths, accepted_host)]
        batch.pending = next_token

    def _stats(self, out: RolloutBuilder, verdicts: list, timing, wall: float, steps: int, config) -> dict:
        generated = sum(o != "env" for row in out.origin for o in row)  # the policy's tokens, not env replies
        stats = {
            "num_prompts": len(out.tokens),
            "num_generated_tokens": generated,
            "num_steps": steps,
            "wall_time_s": wall,
            "tokens_per_s": generated / wall if wall > 0 else 0.0,
            # Counters of the decode loop (sums, so they pool over rollouts and steps): what the Speed page's
            # bound divides by, per verify step, instead of assumed costs.
            "engine/num_steps": steps,
            **{f"engine/{k}_s": v for k, v in timing.items()},
        }
        if config.gamma > 0:
            counters = SpecCounters(gamma=config.gamma, method=config.method)
            if verdicts:
                table = torch.tensor(verdicts, dtype=torch.float64)  # [N, 1+γ]
                counters.update(table[:, 0].long(), table[:, 1:], validate=False)
            counts = counters.to_dict()
            stats.update(counts)
            stats.update(derive(counts))
        return stats
