"""Batched plain and speculative generation with an MTP draft head (or prompt lookup, `bebop.engine.lookup`).

One loop serves plain decoding (gamma = 0) and speculative decoding, so comparisons are fair.
Per speculative step, for every active row at once, each row at its own depth (a static γ or gamma="auto" give every
row the same; gamma="rows" each its own, from the head or prompt lookup: bebop.engine.depth.rows):

  1. draft    each row's tokens from the MTP head (sampled from q for "rs", argmax q for "to"/"greedy") or prompt
              lookup; q stays over the head's draft vocabulary (bebop.engine.sources)
  2. verify   one target forward over each row's [pending token, drafts] (its depth + 1 positions, the rows packed:
              bebop.engine.ragged), then `bebop.verify.verify_scores`; a row at depth 0 decodes plainly in it
  3. sync     ONE device->host transfer: accepted counts, emitted tokens, their log-probs and entropies
  4. retire   rows that hit a stop token or string or their budget leave the batch (the long tail shrinks it)
  5. advance  each row's KV cache by its own accepted count + 1 (lengths only: a rejected draft's slots stay, stale,
              to be overwritten), and catch the head's cache up on the accepted tokens; the same forward yields the
              next step-1 draft. A step where no row drafts leaves the head's cache behind, to catch up when a step
              drafts again (bebop.engine.head_cache): plain decoding then costs what it costs without a head, and the
              head stays ready for the tail

The device work of 1, 2 and 5 is `bebop.engine.step` (draft, verify_rows, catch_up), eager or compiled, which also owns
the layouts shared with this module: the step's uniforms (`draw_uniforms`, from the engine's generator) and the
host table (`unpack_host_row`, read back by bebop.engine.retire). This module keeps the host side: the generator,
the depth's decision before each step (from what the rows emitted only), the bookkeeping of rows. A `PhaseClock`
(bebop.engine.phases) times each step's phases.

State between steps: the target cache holds positions 0..L-1 of a row, `pending` is the token at L (sampled,
not yet in the cache), and the head's cache is valid up to L-1, where its last entry is the step-1 draft query
f(h_{L-1}, y_L). Stale cache slots past a row's length are overwritten later, never read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from bebop.engine.batch import Batch, pad_feeds, rows_of, shared_runs
from bebop.engine.buckets import Buckets, CachePool
from bebop.engine.depth import Choice, Depth, DepthConfig, DepthController, FixedDepth
from bebop.engine.head_cache import FeedRows, HeadCache
from bebop.engine.lookup import PromptLookup
from bebop.engine.phases import PhaseClock, tick
from bebop.engine.rollout import Env, GenerationConfig, Rollout, RolloutBuilder, check_request, decode_stats
from bebop.engine.stops import Decode
from bebop.engine.ragged import layout_of
from bebop.engine.depth.rows import RowDepths, RowsConfig
from bebop.engine.sources import Histories, by_slot, row_states, step_drafts
from bebop.engine.retire import host_rows, retire
from bebop.engine.step import catch_up, compiled, draft, draw_uniforms, graphed, verify_rows
from bebop.engine.transfer import host_copy, upload
from bebop.models.mtp import check_head_fits
from bebop.models.prepack import prepacked
from bebop.sampling import entropy, probs_from_logits, sample


# The seconds a generate() call adds up per phase (its stats' engine/{part}_s); catch_up is the part of draft spent
# catching the head up after plain steps (a price of switching depth, not of the depth).
TIMING = ("prefill", "draft", "verify", "advance", "catch_up")


@dataclass(frozen=True)
class Stepped:
    """What one decoding step tells the depth that chose it (`Depth.observe`) and the rollout's counters."""

    seconds: float  # the step's seconds, before any env feed
    switch_s: float  # of them, catching the head up after plain steps (a price of switching depth, not of γ)
    num_accepted: list[int]  # per row that ran it
    depths: list[int]  # each row's depth
    draft_s: float  # of `seconds`, drafting: the draft itself (head or lookup) and the head's catch-up on the kept


class Engine:
    """Generation for a target `model` with an optional draft `mtp`: an MTP head, or a `PromptLookup`.

    compile=True runs each phase of a decoding step (bebop.engine.step: the draft loop, the verification forward with its
    sampling and per-token statistics, the head's catch-up) and the prefill forwards as `torch.compile` graphs with
    dynamic shapes (on CPU with inductor's C++ wrapper): a few graphs per phase serve every batch size, cache
    length, prompt width and gamma (row buckets start at 2, since torch specialises sizes 0 and 1; plain steps,
    with no drafts, get their own).
    The first steps pay the compilation (cached on disk by inductor for later processes; its cost is in
    docs/benchmarks.md): worth it for long generation, not for a few short calls. After that a step's hundreds of small ops
    run as a few fused kernels, which on CPU is most of a small model's step time. The randomness comes in as
    uniforms drawn from the engine's generator, so from the same seed the compiled engine draws what the eager one
    draws. Parameters stay graph inputs (no freezing), so a policy that an optimiser updates in place is sampled
    as updated.

    On CUDA, compile=True also runs each step phase as CUDA graphs (mode="reduce-overhead"): a step of a small or
    mid-sized model is otherwise bound by launching hundreds of kernels from Python, not by the GPU. A graph
    replays fixed shapes at fixed addresses, so the engine keeps both fixed (bebop.engine.buckets): rows padded up
    to a few batch sizes (finished rows stay as padding until the survivors fit a smaller size), attended slots
    rounded up, and KV caches that persist across steps and calls (`CachePool`, marked static because the graphs
    write into them). The graphs' outputs are cloned as they come out, because a later replay reuses their memory.
    Prefill keeps dynamic shapes without graphs (a graph per prompt width would rarely be replayed). The host
    tables (row indices, prompt feeds) go up from pinned memory without blocking, and the one table that comes
    back per step is the step's only host sync (marked HOST SYNC; bebop.engine.transfer). `buckets` overrides
    the padding (default: `Buckets()` for CUDA graphs, else `Buckets.exact()`); it changes no row's output.
    """

    # Every rollout token's entropy comes with the rollout (the trainer measures it itself where an engine's
    # `full_logprobs` is False: VLLMEngine on a large vocabulary).
    full_logprobs = True

    def __init__(self, model: torch.nn.Module, mtp: torch.nn.Module | PromptLookup | None = None, *,
                 compile: bool = False, buckets: Buckets | None = None, depth: DepthController | None = None,
                 phases: PhaseClock | None = None):
        # The draft: an MTP head, or prompt lookup (a draft with no model: bebop.engine.lookup).
        self.lookup = mtp if isinstance(mtp, PromptLookup) else None
        mtp = None if self.lookup is not None else mtp
        self.model, self.mtp, self.compiled = model, mtp, compile
        # the backbone layers a fused head reads beside the top hidden: the target's forwards hand it their features
        self.taps = () if mtp is None else mtp.feature_layers
        # gamma="auto": what chooses each step's depth. It learns across generate() calls (acceptance and step
        # costs of this engine), so one is kept per (max_gamma, method); `depth` fixes the one every call uses.
        self.depth, self._fixed_depth, self._depths = depth, depth is not None, {}
        self.phases = phases  # a PhaseClock times every decoding step's phases (profiling: bebop.engine.phases)
        self.row_lookup = PromptLookup()  # the rows a per-row choice has draft by lookup beside the head
        self.config = model.config
        if mtp is not None:
            check_head_fits(mtp.config, self.config)
        if compile and self.taps:
            # tests/test_fused_features.py found the compiled steps' RS draws leaving the eager engine's after the
            # first verification; until that is found, a fused head decodes eager only
            raise ValueError(f"the compiled engine does not decode a head with fused features (feature layers "
                             f"{list(self.taps)}) yet: run it without compile")
        self.cudagraphs = compile and self.device.type == "cuda"
        self.buckets = buckets or (Buckets() if self.cudagraphs else Buckets.exact())
        self.pool = CachePool(static=self.cudagraphs) if self.buckets.padded else None
        if compile:
            # Dynamo's recompile limit (8) counts per code object, over every model a process compiles: two
            # models' graphs of Transformer.forward would exhaust it and silently fall back to eager.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        if self.cudagraphs:  # one graph is recorded per bucket shape: more than the default warning's 8
            torch._inductor.config.triton.cudagraph_dynamic_shape_warn_limit = None
        # On CPU the generated Python wrapper that calls a graph's few dozen kernels costs about as much as the
        # small kernels themselves; a C++ wrapper (the same kernels) measured faster plain steps, most at batch 1,
        # and compiles no slower (docs/benchmarks.md).
        options = {"cpp_wrapper": True} if self.device.type == "cpu" else None
        wrap = (lambda fn: compiled(fn, options)) if compile else (lambda fn: fn)
        # The cached forwards (prefill, step costs), compiled or not: model.forward, and the head's in its cache.
        self.target_step = wrap(model.forward)
        self.head_cache = None if mtp is None else HeadCache(model, mtp, wrap(mtp.forward_cached),
                                                              wrap(mtp.write_keys), self.buckets)
        # A decoding step's device work (bebop.engine.step), each phase one graph when compiled.
        step_wrap = graphed if self.cudagraphs else wrap
        self.draft_step, self.verify_step, self.catch_up_step = (step_wrap(f) for f in (draft, verify_rows, catch_up))

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    def packed_weights(self):
        """The context generate() runs in: eagerly on CPU in bf16, linear weights packed for oneDNN once per
        weight version instead of on every matmul (bebop.models.prepack; measured faster steps: docs/benchmarks.md)."""
        return prepacked(self.model, self.mtp, enabled=not self.compiled)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], config: GenerationConfig, *, env: Env | None = None,
                 decode: Decode | None = None) -> Rollout:
        """Complete every prompt. With `env`, a row that emits a stop token (or completes a stop string) gets
        env(row, tokens, stop)'s reply appended (origin "env") and continues from its cached prefix; a None reply ends
        the row. `decode` (the tokenizer's) is needed only for `config.stop_strings`."""
        check_request(prompts, config, self.config, self.mtp if self.mtp is not None else self.lookup)
        generator = torch.Generator(device=self.device)
        # Not torch.seed(): that reseeds the global generator with OS entropy, behind the caller's back.
        seed = config.seed if config.seed is not None else int(torch.randint(2**62, ()))
        generator.manual_seed(seed)
        # per depth γ, per verified row: [num_accepted, H(p_1..p_γ)], counted once at the end
        verdicts: dict[int, list[list[float]]] = {}
        timing = dict.fromkeys(TIMING, 0.0)
        depth = self.depth_for(config)
        choices: list[tuple[Choice, float, int]] = []  # each step's decision, measured seconds and accepted drafts
        out = RolloutBuilder(len(prompts), config, env, self.config.vocab_size, decode, prompts=prompts)
        start = time.perf_counter()
        with self.packed_weights():
            batch = self._new_batch(prompts, config)
            self._settle(batch, [(i, 0, list(p)) for i, p in enumerate(prompts)], config, generator, out)
            timing["prefill"] = time.perf_counter() - start
            clock, histories = self.phases, Histories(self.lookup or self.row_lookup, out)
            while batch.rows:
                if clock is not None:
                    clock.begin()
                # The depth comes from earlier steps' counters only, never this step's draws: lossless.
                rows = len(batch.rows)
                choice = (depth.decide(rows, row_states(batch, out, histories if depth.config.lookup else None))
                          if getattr(depth, "per_row", False) else depth.decide(rows))
                tick(clock, "depth")
                step = self._step(batch, choice, config, generator, (out, histories), verdicts, timing)
                if getattr(depth, "per_row", False):
                    depth.observe(rows, choice.gamma, step.seconds, step.num_accepted, step.switch_s, step.draft_s)
                else:
                    depth.observe(rows, choice.gamma, step.seconds, step.num_accepted, switch_s=step.switch_s)
                choices.append((choice, step.seconds, sum(step.num_accepted)))
                if clock is not None:
                    clock.end("depth", kind=f"γ={choice.gamma}" if choice.gamma else "plain", rows=rows,
                              tokens=rows + sum(step.num_accepted))
        wall = time.perf_counter() - start
        return out.build(decode_stats(out, verdicts, timing, wall, choices, config))

    def depth_for(self, config: GenerationConfig) -> Depth:
        """What picks each step's depth in a call with `config`: its fixed γ, or under gamma="auto" the engine's
        controller for (max_gamma, method), which learns across calls."""
        if not config.auto:
            return FixedDepth(config.gamma)
        if self._fixed_depth:
            if self.depth.max_gamma != config.max_gamma:
                raise ValueError(f"the engine's depth controller chooses up to {self.depth.max_gamma}, "
                                 f"config.max_gamma is {config.max_gamma}")
            return self.depth
        key = (config.max_gamma, config.method, config.per_row)
        if key not in self._depths:
            rows = RowsConfig(config.max_gamma, head=self.mtp is not None)
            self._depths[key] = RowDepths(rows) if config.per_row else DepthController(DepthConfig(config.max_gamma))
        self.depth = self._depths[key]
        return self.depth

    # ----------------------------------------------------------------------------------------------
    def _probs(self, logits: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
        return probs_from_logits(logits, *config.sampling)

    def _sync(self, config: GenerationConfig) -> None:
        if config.profile and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _cache(self, owner: torch.nn.Module, rows: int, max_len: int):
        return owner.new_cache(rows, max_len) if self.pool is None else self.pool.get(owner, rows, max_len)

    def _new_batch(self, prompts: list[list[int]], config: GenerationConfig) -> Batch:
        n, device, rows = len(prompts), self.device, self.buckets.capacity(len(prompts))
        max_len = self.buckets.cache_len(max(len(p) for p in prompts) + config.max_new_tokens + config.depth + 1,
                                         self.config.max_position_embeddings)
        batch = Batch(list(range(n)), [0] * n, list(range(n)), torch.zeros(rows, dtype=torch.long, device=device),
                       self._cache(self.model, rows, max_len))
        if config.depth > 0 and self.mtp is not None:
            batch.draft_cache = self._cache(self.mtp, rows, max_len)
            batch.draft_hidden = torch.zeros(rows, 1, self.config.hidden_size, dtype=batch.cache.dtype, device=device)
            batch.draft_logits = torch.zeros(rows, self.mtp.draft_size, dtype=batch.cache.dtype, device=device)
        return batch

    def _feed(self, batch: Batch, feeds: list[tuple[int, int, list[int]]], config, generator) -> list[list[float]]:
        """Prefill token runs into some rows and sample each row's next token from the target.

        feeds: (row in batch, start position, tokens) — a prompt at 0, or [stop token, env reply...] where a row
        parked. Those rows' caches get the tokens at start.., their pending token becomes the sample, and the
        head's cache is caught up so its step-1 draft is ready. A prompt several rows share (a GRPO group's) is
        run once and its K/V copied to the others (`shared_runs`); each row still draws its own next token.
        Returns [token, logprob, entropy] per feed."""
        if batch.head_lag:  # the feed writes the head's entries from `start` on: the ones before must be there
            self.head_cache.catch_up(batch)
        run, position = shared_runs(feeds)
        slots = [batch.slots[i] for i, _, _ in feeds]
        tokens, starts, last = pad_feeds([feeds[j] for j in run], self.device)  # [U, W], [U], [U]
        kv_len = max(s for _, s, _ in feeds) + tokens.shape[1]
        for cache in (batch.cache, batch.draft_cache):
            if cache is not None and kv_len > cache.max_len:
                cache.grow(self.buckets.cache_len(kv_len))
                if self.pool is not None:
                    self.pool.mark(cache)
        # Where each row's K/V comes from: (rows that copy, the rows they copy), both [F - U] slots.
        copies = [(slots[j], slots[run[position[j]]]) for j in range(len(feeds)) if run[position[j]] != j]
        copies = tuple(upload(list(c), self.device) for c in zip(*copies)) if copies else None
        run_slots = [slots[j] for j in run]
        run_index = upload(run_slots, self.device)  # [U]
        whole = run_slots == list(range(batch.capacity))  # e.g. an unpadded prefill: no sub-caches
        with rows_of(batch.cache, run_index, whole) as cache:
            cache.lengths.copy_(starts)
            _, hidden = self.target_step(tokens, cache, kv_len=kv_len, compute_logits=False,
                                         taps=self.taps)  # [U, W, (1 + n) d]
            cache.lengths += last + 1
        if copies is not None:
            batch.cache.copy_rows(copies[1], copies[0])
        hidden_last = hidden[torch.arange(len(run), device=self.device), last]  # [U, d]
        target_probs = self._probs(self.model.lm_logits(hidden_last), config)  # [U, V]
        if copies is not None:
            gather = upload(position, self.device)  # [F]
            hidden_last, target_probs = hidden_last[gather], target_probs[gather]  # [F, d], [F, V]
        token = sample(target_probs, generator)  # [F]: one draw per row, shared prompt or not
        index = upload(slots, self.device)  # [F]
        if batch.draft_cache is not None:
            rows = FeedRows(index, run_index, whole, slots == list(range(batch.capacity)), copies)
            self.head_cache.feed(batch, rows, hidden, hidden_last, tokens, token, starts, last, kv_len)
        batch.pending[index] = token
        for (i, s, feed) in feeds:
            batch.lengths[i] = s + len(feed)
        logp = target_probs.gather(-1, token[:, None])[:, 0].log()  # [F]
        table = torch.stack([token.double(), logp.double(), entropy(target_probs).double()], 1)  # [F, 3]
        return host_copy(table).tolist()  # HOST SYNC (a feed: the prefill, or a step's rows that got env replies)

    def _settle(self, batch: Batch, feeds, config, generator, out: RolloutBuilder) -> None:
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
            batch.keep(self.buckets, self.pool, (self.model, self.mtp), [i for i in range(len(batch.rows)) if i not in done])

    def _step(self, batch: Batch, choice: Choice, config, generator, rollout: tuple[RolloutBuilder, Histories],
              verdicts: dict, timing) -> Stepped:
        """One decoding step, each row at its depth in `choice`, into `rollout` (what the rows emitted, and their
        lookup indexes): what it took and what each row accepted."""
        clock, (out, histories) = self.phases, rollout
        depths = choice.row_depths()
        gamma = max(depths, default=0)
        kv_len = self.buckets.kv_len(max(batch.lengths) + gamma + 1, batch.cache.max_len)
        t0, switch_s = time.perf_counter(), 0.0
        if gamma > 0 and batch.head_lag:  # the price of drafting again after plain steps, told apart from γ's own
            self.head_cache.catch_up(batch)
            switch_s = time.perf_counter() - t0
            tick(clock, "catch_up")
        uniforms = draw_uniforms(len(batch.rows), gamma, self._uniforms_method(choice, config), generator, self.device)
        if batch.capacity > len(batch.rows):  # padding rows draw nothing: the live rows' draws stay the same
            uniforms = uniforms.new_zeros(batch.capacity, uniforms.shape[1]).index_copy_(
                0, upload(batch.slots, self.device), uniforms)  # [P, n]
        tick(clock, "uniforms")
        # 1. draft: each row to its own depth, from the head or prompt lookup (bebop.engine.sources)
        drafts = step_drafts(self, batch, choice, config, uniforms, histories)
        ragged = choice.depths is not None and len(set(depths)) > 1
        widths = by_slot(batch, [d + 1 for d in depths], 1) if ragged else [gamma + 1] * batch.capacity
        layout = layout_of(widths, batch.capacity, self.device, self.taps)
        self._sync(config)
        t1 = time.perf_counter()
        # 2. verify: one target forward over each row's pending token and its drafts
        host, num_accepted, next_token, emitted, hidden = self.verify_step(
            self.model, batch.pending, drafts, batch.cache, uniforms, kv_len=kv_len, method=config.method,
            sampling=config.sampling, layout=layout, clock=None if self.compiled else clock)
        tick(clock if self.compiled else None, "compiled")
        self._sync(config)
        t2 = time.perf_counter()
        # 3. sync: the one device->host copy per step
        results = host_rows(host, batch, depths, verdicts, clock)  # HOST SYNC
        # 4. retire finished rows; rows whose stop token got an env reply are parked for a feed
        keep, parked = retire(batch, results, depths, out)
        tick(clock, "retire")
        # 5. advance the survivors
        if len(keep) < len(batch.rows):
            written = None if self.compiled else kv_len  # compiled graphs guard on strides: no in-place views
            index = batch.keep(self.buckets, self.pool, (self.model, self.mtp), keep, through=written)
            if index is not None:
                num_accepted, next_token, emitted, hidden = (x[index] for x in (num_accepted, next_token, emitted,
                                                                                hidden))
            tick(clock, "compact")
        head_s = 0.0
        if batch.rows:
            head_s = self._advance(batch, gamma, num_accepted, [results[i].num_accepted for i in keep], next_token,
                                   emitted, hidden, config)
            tick(clock, "advance")
        seconds = time.perf_counter() - t0
        if parked:
            self._settle(batch, parked, config, generator, out)
            tick(clock, "feed")
        self._sync(config)
        t3 = time.perf_counter()
        for part, seconds_in in (("draft", t1 - t0), ("catch_up", switch_s), ("verify", t2 - t1), ("advance", t3 - t2)):
            timing[part] += seconds_in
        return Stepped(seconds, switch_s, [r.num_accepted for r in results], depths, t1 - t0 - switch_s + head_s)

    def _uniforms_method(self, choice: Choice, config) -> str:
        """The uniforms' layout (bebop.engine.step): a lookup's q is one-hot at its draft, RS's test is then TO's, so a
        step whose every row drafts by lookup draws TO's numbers (no draft draws)."""
        looked = choice.lookup if choice.lookup is not None else (self.lookup is not None,)
        return "to" if all(looked) and config.method == "rs" else config.method

    def _advance(self, batch: Batch, gamma: int, num_accepted, accepted_host: list[int], next_token, emitted,
                 hidden, config) -> float:
        """Move the caches past what each row kept; returns the seconds of the head's catch-up (0 without one)."""
        start = time.perf_counter()
        head_s = 0.0
        if batch.draft_cache is not None and gamma == 0:  # gamma="auto" chose plain decoding: the head waits
            batch.head_lag.append((hidden, emitted))  # [P, 1, d], [P, 1]
            batch.cache.lengths += 1
        elif batch.draft_cache is not None:
            batch.draft_hidden, batch.draft_logits = self.catch_up_step(
                self.model, self.mtp, hidden, emitted, num_accepted, batch.cache, batch.draft_cache,
                kv_len=self.buckets.kv_len(max(batch.lengths) + gamma + 1, batch.cache.max_len),
                clock=None if self.compiled else self.phases)
            tick(self.phases if self.compiled else None, "compiled")
            head_s = time.perf_counter() - start
        else:
            batch.cache.lengths += num_accepted + 1
        if batch.capacity > len(batch.rows):
            # Padding rows advance too; held where their next writes still fit (live rows never get that far).
            for cache in (batch.cache, batch.draft_cache):
                if cache is not None:
                    cache.lengths.clamp_(max=cache.max_len - config.depth - 1)
        batch.lengths = [length + n + 1 for length, n in zip(batch.lengths, accepted_host)]
        batch.pending = next_token
        return head_s
