"""The character tokenizer: round trips on every task text, HF AutoTokenizer parity, save/load, the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bebop.data import tasks
from bebop.data.tokenizer import (
    ALPHABET,
    CALL_CLOSE,
    EOS,
    PROTOCOL_TOKENS,
    SPECIAL_TOKENS,
    CharTokenizer,
    HFTokenizer,
    is_char_tokenizer,
    load_tokenizer,
)
from bebop.engine.stops import split_stops

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def task_texts() -> list[str]:
    """Prompts plus right and wrong demonstrations from every task and level."""
    texts, gen = [], torch.Generator().manual_seed(0)
    for name in tasks.TASKS:
        task = tasks.get(name)
        for level in task.levels:
            for example in task.sample(15, seed=level, level=level):
                texts.append(example.prompt + task.demonstration(example, gen, error_rate=0.5) + EOS)
    return texts


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    return str(CharTokenizer().save(tmp_path_factory.mktemp("char_tok")))


def test_vocabulary_is_fixed_and_documented():
    tok = CharTokenizer()
    assert tok.vocab_size == len(SPECIAL_TOKENS) + len(ALPHABET) == 104
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert [tok.token_str(i) for i in range(8)] == list(SPECIAL_TOKENS)
    for marker in PROTOCOL_TOKENS + (EOS,):
        assert len(tok.encode(marker)) == 1
    assert tok.encode("az09 .\n") == [tok.token_id(c) for c in "az09 .\n"]


def test_round_trip_on_all_task_texts(task_texts):
    tok = CharTokenizer()
    for text in task_texts:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert "".join(tok.token_str(i) for i in ids) == text  # per-token strings tile the text
    # markers are single tokens inside text, and a lone "<" stays a character
    ids = tok.encode("x<y<call>calc 1</call>")
    assert ids[1] == tok.token_id("<") and tok.token_id("<call>") in ids and len(ids) == 3 + 1 + 6 + 1


def test_unknown_characters_raise_a_clear_error():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="outside the tokenizer alphabet.*'é'"):
        tok.encode("café")
    with pytest.raises(ValueError, match="'\\\\t'"):
        tok.encode("a\tb")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="must be a str"):
        tok.encode(["a"])


def test_hf_autotokenizer_parity(saved, task_texts):
    tok, hf = CharTokenizer(), transformers.AutoTokenizer.from_pretrained(saved)
    assert len(hf) == tok.vocab_size
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (tok.eos_id, tok.pad_id, tok.bos_id)
    extra = ["a . b , c ' s", "  leading and trailing  ", "x<y>z </result>", "<pad><bos>"]
    for text in task_texts + extra:
        ids = tok.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids, text
        assert hf.encode(text) == ids  # no post-processor: nothing added behind the caller's back
        assert hf.decode(ids, skip_special_tokens=False) == text


def test_save_load_and_load_tokenizer_picks_the_char_tokenizer(saved, tmp_path):
    assert is_char_tokenizer(saved)
    loaded = load_tokenizer(saved)
    assert isinstance(loaded, CharTokenizer)
    assert loaded.vocab == CharTokenizer().vocab
    config = json.loads((Path(saved) / "tokenizer_config.json").read_text())
    assert config["eos_token"] == EOS
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="bebop character tokenizer"):
        CharTokenizer.load(tmp_path)


def test_hf_adapter_matches_the_char_tokenizer(saved, task_texts):
    tok, adapter = CharTokenizer(), HFTokenizer.load(saved)
    assert (adapter.vocab_size, adapter.eos_id, adapter.pad_id, adapter.bos_id) == (
        tok.vocab_size,
        tok.eos_id,
        tok.pad_id,
        tok.bos_id,
    )
    for text in task_texts[:40]:
        ids = tok.encode(text)
        assert adapter.encode(text) == ids
        assert adapter.decode(ids) == text
    assert [adapter.token_str(i) for i in range(tok.vocab_size)] == list(tok.vocab)
    assert split_stops((EOS, CALL_CLOSE), adapter.encode, adapter.eos_id) == \
        split_stops((EOS, CALL_CLOSE), tok.encode, tok.eos_id) == ((1, tok.token_id(CALL_CLOSE)), ())


def _bpe_dir(path, texts) -> str:
    """A small byte-level BPE tokenizer, standing in for a real model's (e.g. Qwen3's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
    hf.save_pretrained(str(path))
    return str(path)


def test_hf_adapter_over_a_subword_tokenizer(tmp_path, task_texts):
    directory = _bpe_dir(tmp_path / "bpe", task_texts)
    tok = load_tokenizer(directory)
    assert isinstance(tok, HFTokenizer) and not is_char_tokenizer(directory)
    assert tok.pad_id == tok.eos_id  # no pad token: falls back to EOS
    for text in [t.replace(EOS, "") for t in task_texts[:40]]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert len(ids) < len(text)  # merges learned on these very texts shorten them
    assert tok.decode(tok.encode("café, naïve")) == "café, naïve"  # byte-level: any text round-trips
    assert split_stops((EOS,), tok.encode, tok.eos_id) == ((tok.eos_id,), ())  # "<eos>": this tokenizer's own EOS
    assert split_stops((CALL_CLOSE,), tok.encode, tok.eos_id) == ((), (CALL_CLOSE,))  # several tokens: text
    with pytest.raises(ValueError, match="not one"):
        tok.token_id(CALL_CLOSE)
    saved = tok.save(tmp_path / "again")
    assert load_tokenizer(saved).encode("answer: 42") == tok.encode("answer: 42")
    with pytest.raises(ValueError, match="transformers tokenizer"):
        HFTokenizer(object())


def test_stops_and_chat_template_of_the_char_tokenizer():
    tok = CharTokenizer()
    assert split_stops((EOS, CALL_CLOSE, EOS), tok.encode, tok.eos_id) == ((tok.eos_id, tok.token_id(CALL_CLOSE)), ())
    assert split_stops(("ab",), tok.encode, tok.eos_id) == ((), ("ab",))  # several characters: matched on text
    assert not tok.has_chat_template
    with pytest.raises(ValueError, match="no chat template"):
        tok.chat_prompt([{"role": "user", "content": "hi"}])
