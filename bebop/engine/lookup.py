"""Prompt lookup: a draft source that needs no head, the free baseline every head has to beat
(`Engine(model, PromptLookup())`; `--head lookup` / `--heads lookup` in the jobs that measure drafts).

Proposes the tokens that followed the last earlier occurrence of the row's most recent n-gram (vLLM's n-gram
proposer, Hugging Face's `prompt_lookup_num_tokens`): answers copy names, numbers and code from their prompt and
from themselves, and those continuations cost one verification and no model.

    history:  ... a b c d ... x a b c   (pending token c, not yet verified)
    match:    the last earlier "a b c" (the longest n-gram that occurs, n from `max_ngram` down to `min_ngram`)
    draft:    d ...                    the γ tokens that followed it

Its q is one-hot at each drafted token, so rejection sampling accepts a draft with probability p(token) and
recovers from p with that token taken out: exactly TO's test, whatever the method asked (`bebop.verify`). A row
without a match, or with fewer than γ tokens after it, repeats its last proposed token to fill the step: the
engine verifies a rectangle of γ per row, and those positions count as drafted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptLookup:
    """Drafts by n-gram match over each row's own history (prompt, completion so far, environment replies)."""

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.min_ngram, int) and isinstance(self.max_ngram, int)
                and 1 <= self.min_ngram <= self.max_ngram):
            raise ValueError(f"PromptLookup needs 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")

    def to(self, *args, **kwargs) -> PromptLookup:
        """Itself: a lookup has no tensors to move (callers move heads and lookups alike)."""
        return self

    def propose(self, history: list[int], gamma: int) -> list[int]:
        """γ draft tokens continuing `history` (whose last token is the pending one)."""
        n, start = self.match(history)
        if n == 0:
            return [history[-1]] * gamma
        follow = history[start + n:start + n + gamma]
        return follow + [follow[-1]] * (gamma - len(follow))

    def match(self, history: list[int]) -> tuple[int, int]:
        """(n, start): the longest n-gram ending `history` that occurred earlier, and where its latest earlier
        occurrence starts; (0, 0) without one. n is what a per-row choice of draft reads: the longer the match, the
        likelier its continuation (bebop.engine.depth.rows)."""
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            suffix = history[-n:]
            for start in range(len(history) - n - 1, -1, -1):  # the latest earlier occurrence wins
                if history[start:start + n] == suffix:
                    return n, start
        return 0, 0


class LookupIndex:
    """`PromptLookup.match` / `propose` over one row's growing history in O(max_ngram) per token instead of a scan of
    the whole history per step: for each n-gram, where its latest occurrence starts and where the one before it did
    (the latest *earlier* occurrence of the suffix is the one before the suffix itself)."""

    def __init__(self, lookup: PromptLookup):
        self.lookup, self.tokens = lookup, []
        self._starts: dict[tuple[int, ...], tuple[int, int | None]] = {}  # n-gram -> (latest start, previous)

    def extend(self, tokens: list[int]) -> None:
        """Append `tokens` to the history."""
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens)
            for n in range(self.lookup.min_ngram, min(self.lookup.max_ngram, end) + 1):
                gram = tuple(self.tokens[end - n:])
                latest = self._starts.get(gram)
                self._starts[gram] = (end - n, None if latest is None else latest[0])

    def match(self) -> tuple[int, int]:
        """As `PromptLookup.match(history)`."""
        for n in range(min(self.lookup.max_ngram, len(self.tokens) - 1), self.lookup.min_ngram - 1, -1):
            entry = self._starts.get(tuple(self.tokens[-n:]))
            if entry is not None and entry[1] is not None:
                return n, entry[1]
        return 0, 0

    def propose(self, gamma: int) -> list[int]:
        """As `PromptLookup.propose(history, gamma)`."""
        n, start = self.match()
        if n == 0:
            return [self.tokens[-1]] * gamma
        follow = self.tokens[start + n:start + n + gamma]
        return follow + [follow[-1]] * (gamma - len(follow))
