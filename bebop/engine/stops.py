"""Stops: where a completion ends, decided once, as its tokens arrive, for every caller.

A task names its stops as text (`task.stop_strings`; "<eos>" is the tokenizer's EOS). `split_stops` turns those
that are one token into engine stop ids, checked per token without decoding; the rest stay strings, matched as
vLLM's `stop` is: on the decoded completion, so a string may span several tokens.

As each step's tokens arrive (`RolloutBuilder`, for bebop's engine and the vLLM backend alike), `StopMatcher` finds
the first one that is a stop token or completes a stop string. The row keeps its tokens through it (the rest of an
accepted speculative chunk is dropped) and the engine records a `Stop`: which string it was, and how many
characters the completing token carried past the string's end ("</call>" may end in a token "l>\\n"). Texts are cut
from that record, never matched again: an environment reads the transcript through the stop's end
(`text_through`), a reward the completion before it (`text_before`): "answer: 7", not "answer: 7<|im_end|>".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from bebop.data.tokenizer import EOS

# A UTF-8 character is at most 4 bytes and a byte-level token holds at least one byte, so a string of c characters
# spans at most 4c tokens: the tail decoded before a step's new tokens.
_TOKENS_PER_CHAR = 4

# decode(token ids) -> text: the tokenizer's, needed to match stop strings and to cut texts.
Decode = Callable[[list[int]], str]


def split_stops(strings: Iterable[str], encode: Callable[[str], list[int]], eos_id: int
                ) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(stop ids, stop strings) for the engine: "<eos>" and strings that are one token become ids; a string of
    several tokens stays text."""
    ids, texts = [], []
    for s in strings:
        one = [eos_id] if s == EOS else encode(s)
        (ids if len(one) == 1 else texts).append(one[0] if len(one) == 1 else s)
    return tuple(dict.fromkeys(ids)), tuple(dict.fromkeys(texts))


def find_stop(text: str, strings: Sequence[str], after: int) -> tuple[int, int] | None:
    """(start, end) of the stop string in `text` that ends first among those ending past character `after`
    (ties: the longest), or None. Matches ending at or before `after` were there before and are not new."""
    best = None
    for s in strings:
        i = text.find(s, max(0, after - len(s) + 1))
        if i >= 0 and (best is None or (i + len(s), i) < (best[1], best[0])):
            best = (i, i + len(s))
    return best


@dataclass(frozen=True)
class Stop:
    """The stop that ended a completion (or one turn of it), found when its last token arrived."""

    string: str | None = None  # the stop string its last token completed; None: the last token is a stop token
    tail: int = 0  # characters the last token carried past the string's end


class StopMatcher:
    """Finds where a row stops among a step's new tokens, decoding only a bounded tail of the tokens before them."""

    def __init__(self, stop_tokens: Sequence[int], stop_strings: Sequence[str], decode: Decode | None):
        if stop_strings and decode is None:
            raise ValueError(f"stop_strings {tuple(stop_strings)!r} need a decode function to match text")
        self.tokens, self.strings, self.decode = set(stop_tokens), tuple(stop_strings), decode
        self.tail = _TOKENS_PER_CHAR * max((len(s) for s in self.strings), default=0)

    def first(self, before: list[int], new: list[int]) -> tuple[int, Stop] | None:
        """(j, stop) for the first of `new` (about to follow `before`) that is a stop token or completes a stop
        string, else None."""
        first = next((j for j, t in enumerate(new) if t in self.tokens), None)
        found = None if first is None else (first, Stop())
        if not self.strings or not new:
            return found
        old = before[-self.tail:]
        after = len(self.decode(old)) if old else 0
        if find_stop(self.decode(old + new), self.strings, after) is None:  # the usual step: two short decodes
            return found
        for j in range(len(new) if first is None else first):  # a stop token at `first` ends the row anyway
            text = self.decode(old + new[:j + 1])
            match = find_stop(text, self.strings, after)
            if match is not None:
                return j, Stop(text[match[0]:match[1]], len(text) - match[1])
        return found


def text_before(decode: Decode, tokens: list[int], stop: Stop | None) -> str:
    """What a reward reads: the completion decoded, without the stop that ended it (all of it when none did)."""
    if stop is None:
        return decode(tokens)
    if stop.string is None:
        return decode(tokens[:-1])
    text = decode(tokens)
    return text[:len(text) - stop.tail - len(stop.string)]


def text_through(decode: Decode, tokens: list[int], stop: Stop | None) -> str:
    """What an environment reads: the transcript so far, through the end of the stop that paused it."""
    text = decode(tokens)
    return text if stop is None else text[:len(text) - stop.tail]
