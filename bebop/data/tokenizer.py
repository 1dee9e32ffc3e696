"""Tokenizers: a fixed character-level one for bebop's tiny tasks, and an adapter for any HF tokenizer.

The tiny policy reads and writes one character per token. Its vocabulary is fixed, so every checkpoint
trained on bebop's tasks agrees on ids without shipping anything but the two JSON files:

    ids 0-7    specials  <pad> <eos> <bos> <unk>  and the agent protocol markers
                         <call> </call> <result> </result> (one token each, so the engine can stop on
                         `</call>` and the RL loop can find tool replies by id)
    id  8      "\\n"
    ids 9-103  printable ASCII, " " (32) through "~" (126), in code-point order

104 tokens in all. The task texts use a small subset (lowercase, digits, punctuation, a little Python);
the rest of printable ASCII is there so a user's prompt or a model's Python never hits a hole.

Unknown characters: `CharTokenizer.encode` raises a `ValueError` naming them. A silent `<unk>` would let
a task-alphabet bug train a model on garbage; failing loudly finds it on the first batch. `<unk>` still
exists (id 3) because the Hugging Face file needs one: `AutoTokenizer` maps unknown characters to it
instead of failing, and is otherwise identical on every text our encoder accepts.

Saved layout (`save(dir)`) is the Hugging Face one: `tokenizer.json` (a `tokenizers` BPE model with no
merges, i.e. one token per character, and a `Fuse` decoder), `tokenizer_config.json`,
`special_tokens_map.json`. `transformers.AutoTokenizer.from_pretrained(dir)` loads it and encodes
identically. `load_tokenizer(dir)` returns a `CharTokenizer` for such a directory and an `HFTokenizer`
(same interface) for any other tokenizer directory, e.g. a real Qwen3 checkpoint.

Interface shared by both classes (what the engine, RL loop and dashboard use):
`encode(text) -> list[int]` (never adds specials), `decode(ids) -> str` (keeps specials, so
`decode(encode(t)) == t`), `vocab_size`, `eos_id`, `pad_id`, `bos_id`, `token_str(id)` (the text of
one token, for per-token colouring), `token_id(text)` (the id of a text that is exactly one token),
`has_chat_template`, `chat_prompt(messages)` (the prompt text of a conversation, generation prompt added), `save(dir)`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE = "<call>", "</call>", "<result>", "</result>"
CONTROL_TOKENS = (PAD, EOS, BOS, UNK)  # "special" in HF terms: dropped by decode(skip_special_tokens=True)
PROTOCOL_TOKENS = (CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE)  # ordinary text that must stay visible
SPECIAL_TOKENS = CONTROL_TOKENS + PROTOCOL_TOKENS
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB = SPECIAL_TOKENS + tuple(ALPHABET)

_FORMAT = "bebop-char-v1"  # marker in tokenizer_config.json that load_tokenizer keys on
_TOKENIZER_FILE, _CONFIG_FILE, _SPECIAL_MAP_FILE = "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"


class _Lookup:
    """What both tokenizers derive from `encode`: single-token lookups."""

    def token_id(self, text: str) -> int:
        ids = self.encode(text)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens for this tokenizer, not one")
        return ids[0]


class CharTokenizer(_Lookup):
    """One token per character of `ALPHABET`, plus the eight special tokens as single tokens."""

    def __init__(self, vocab: Iterable[str] = VOCAB):
        self.vocab: tuple[str, ...] = tuple(vocab)
        missing = [t for t in SPECIAL_TOKENS if t not in self.vocab]
        if missing:
            raise ValueError(f"vocab is missing special tokens {missing}")
        bad = [t for t in self.vocab if len(t) != 1 and t not in SPECIAL_TOKENS]
        if bad:
            raise ValueError(f"vocab entries must be single characters or special tokens, got {bad[:5]}")
        if len(set(self.vocab)) != len(self.vocab):
            raise ValueError("vocab has duplicate entries")
        self._ids = {t: i for i, t in enumerate(self.vocab)}
        # Longest first so "</call>" is never read as "<" + "/call>" or cut short by a shorter marker.
        markers = sorted(SPECIAL_TOKENS, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(m) for m in markers) + ")")

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def pad_id(self) -> int:
        return self._ids[PAD]

    @property
    def eos_id(self) -> int:
        return self._ids[EOS]

    @property
    def bos_id(self) -> int:
        return self._ids[BOS]

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:  # odd pieces are the captured special markers
                ids.append(self._ids[piece])
                continue
            try:
                ids.extend(self._ids[c] for c in piece)
            except KeyError:
                unknown = sorted({c for c in piece if c not in self._ids})
                raise ValueError(
                    f"text has characters outside the tokenizer alphabet: {unknown!r} "
                    f"(printable ASCII and newline only)"
                ) from None
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.token_str(int(i)) for i in ids)

    def token_str(self, token_id: int) -> str:
        if not 0 <= token_id < len(self.vocab):
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {len(self.vocab)})")
        return self.vocab[token_id]

    @property
    def has_chat_template(self) -> bool:
        return False  # bebop's tasks are plain text: the tiny policy never saw a conversation

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        raise ValueError("the character tokenizer has no chat template")

    def save(self, path: str | Path) -> Path:
        """Write the Hugging Face files into directory `path` (created if needed)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self._hf_backend().save(str(path / _TOKENIZER_FILE))
        specials = {"pad_token": PAD, "eos_token": EOS, "bos_token": BOS, "unk_token": UNK}
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **specials,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1 << 20,
            "bebop_format": _FORMAT,
        }
        (path / _CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        (path / _SPECIAL_MAP_FILE).write_text(json.dumps(specials, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CharTokenizer":
        path = Path(path)
        if not is_char_tokenizer(path):
            raise ValueError(f"{path} does not hold a bebop character tokenizer ({_FORMAT})")
        model = json.loads((path / _TOKENIZER_FILE).read_text())["model"]
        by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise ValueError(f"{path / _TOKENIZER_FILE}: vocabulary ids are not contiguous from 0")
        return cls(token for token, _ in by_id)

    def _hf_backend(self):
        """The equivalent `tokenizers.Tokenizer`: BPE without merges is exactly one token per character."""
        from tokenizers import AddedToken, Tokenizer, decoders, models

        backend = Tokenizer(models.BPE(vocab=dict(self._ids), merges=[], unk_token=UNK))
        backend.decoder = decoders.Fuse()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in PROTOCOL_TOKENS])
        return backend


class HFTokenizer(_Lookup):
    """The same interface over any `transformers` tokenizer (e.g. a real Qwen3 checkpoint's)."""

    def __init__(self, hf_tokenizer: Any):
        for name in ("encode", "decode", "eos_token_id"):
            if not hasattr(hf_tokenizer, name):
                raise ValueError(f"hf_tokenizer has no {name!r}: pass a transformers tokenizer")
        if hf_tokenizer.eos_token_id is None:
            raise ValueError("hf_tokenizer has no eos token; generation could never stop")
        self.hf = hf_tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.hf)  # includes added tokens, unlike hf.vocab_size

    @property
    def eos_id(self) -> int:
        return int(self.hf.eos_token_id)

    @property
    def pad_id(self) -> int:
        pad = self.hf.pad_token_id
        return self.eos_id if pad is None else int(pad)  # many chat models ship without a pad token

    @property
    def bos_id(self) -> int | None:
        bos = self.hf.bos_token_id
        return None if bos is None else int(bos)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        return self.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_str(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
        return self.decode([token_id])

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """The template's text for `messages` followed by the assistant's generation prompt (encode it with
        `encode`: the text carries the template's own special tokens)."""
        if not self.has_chat_template:
            raise ValueError("this tokenizer has no chat template (tokenizer_config.json has no chat_template)")
        return self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        self.hf.save_pretrained(str(path))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "HFTokenizer":
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))


Tokenizer = CharTokenizer | HFTokenizer


HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def is_char_tokenizer(path: str | Path) -> bool:
    config = Path(path) / _CONFIG_FILE
    if not config.is_file() or not (Path(path) / _TOKENIZER_FILE).is_file():
        return False
    return json.loads(config.read_text()).get("bebop_format") == _FORMAT


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A `CharTokenizer` if `path` holds one, else an `HFTokenizer` over whatever AutoTokenizer finds there."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    if is_char_tokenizer(path):
        return CharTokenizer.load(path)
    # Without its files AutoTokenizer may still build something from config.json that encodes text to nothing.
    if not any((path / name).is_file() for name in HF_TOKENIZER_FILES):
        raise FileNotFoundError(f"{path} has no tokenizer (none of {', '.join(HF_TOKENIZER_FILES)}): save it beside "
                                "the weights, e.g. AutoTokenizer.from_pretrained(ID).save_pretrained(DIR)")
    try:
        return HFTokenizer.load(path)
    except (OSError, ValueError) as error:
        reason = " ".join(str(error).split())
        raise ValueError(f"{path}: transformers could not load its tokenizer: {reason}") from None
