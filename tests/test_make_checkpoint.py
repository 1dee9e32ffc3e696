"""`bebop make-checkpoint`: what it writes is a transformers checkpoint of the asked family, with the traits of a
real one that bebop must handle (chat template, ChatML EOS, multi-token stop strings, padded embedding rows)."""

from __future__ import annotations

import pytest
import transformers

from bebop.cli import main


@pytest.mark.parametrize("family, cls", [("qwen3", "Qwen3ForCausalLM"), ("qwen2", "Qwen2ForCausalLM"),
                                         ("llama", "LlamaForCausalLM")])
def test_make_checkpoint_writes_a_transformers_model_of_the_family(tmp_path, family, cls):
    out = tmp_path / family
    assert main(["make-checkpoint", str(out), "--family", family, "--hidden-size", "32", "--layers", "1"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == cls
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    assert model.config.vocab_size > len(tokenizer)  # padding rows past the tokenizer, as Qwen3 has
    assert len(tokenizer.encode("</call>", add_special_tokens=False)) > 1  # a stop string that spans tokens
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    if family == "llama":
        assert model.config.rope_parameters["rope_type"] == "llama3"


def test_make_checkpoint_refuses_a_non_empty_directory_in_one_line(tmp_path, capsys):
    (tmp_path / "kept.txt").write_text("mine")
    assert main(["make-checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not an empty directory" in err
    assert (tmp_path / "kept.txt").read_text() == "mine"
