"""Every tensor a training step creates is created on the model's device: checked on any machine, CUDA or not.

A `TorchFunctionMode` sees each call of a tensor factory (torch.zeros, arange, tensor, ...). A call from bebop's code
without `device=` makes a CPU tensor whatever the model's device, which on a GPU is a crash or a silent host round
trip; on a CPU-only machine it would pass unnoticed, so this test names every such call site instead. Host-side
construction (rollouts into token tables, rewards from text) happens before a step and is not checked here."""

from __future__ import annotations

import sys

import pytest
import torch
from test_rl import MODEL, Digits
from torch.overrides import TorchFunctionMode

from bebop.data.tokenizer import CharTokenizer
from bebop.heads.config import TrainMTPConfig
from bebop.heads.step import evaluate, lm_head_weight, new_head, train_step
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.rl import RLConfig, build_trainer

FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.tensor, torch.rand, torch.randn,
             torch.randint, torch.eye, torch.linspace}


class DefaultDeviceFactories(TorchFunctionMode):
    """Records 'file:line factory' for each factory call made by bebop's code without a device."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            frame = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            if frame is not None and "/bebop/" in frame.f_code.co_filename:
                self.calls.append(f"{frame.f_code.co_filename.split('/bebop/')[-1]}:{frame.f_lineno} {func.__name__}")
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny():
    tok = CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL)
    return tok, Transformer(config), MTPHead(config)


def test_the_mode_sees_a_factory_call_without_a_device():
    with DefaultDeviceFactories() as mode:
        torch.zeros(2)
        torch.zeros(2, device="cpu")
    assert mode.calls == []  # the test file is not bebop's code: the mode looks at bebop's call sites only
    from bebop.data.batches import pad

    with DefaultDeviceFactories() as mode:
        pad([[1, 2], [3]], 0)  # host construction by design
    assert mode.calls and all("data/batches.py" in c for c in mode.calls)


@pytest.mark.parametrize("mtp, kl", [("online-tv", 0.1), ("frozen", 0.0)])
def test_the_grpo_update_creates_every_tensor_on_the_models_device(tiny, tmp_path, mtp, kl):
    tok, model, head = tiny
    config = RLConfig.tiny(method="rs", mtp=mtp, kl_coef=kl, micro_batch_tokens=16)
    trainer = build_trainer(config, model, tok, head=head, run_dir=tmp_path / "run", task=Digits())
    batch = trainer._generate(0, 0)
    with DefaultDeviceFactories() as mode:
        trainer.update(batch)
    trainer.writer.close()
    assert mode.calls == [], sorted(set(mode.calls))


def test_the_head_training_step_creates_every_tensor_on_the_models_device(tiny):
    _, model, _ = tiny
    config = TrainMTPConfig.tiny()
    head = new_head(model, config)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (2, 24), generator=gen)  # [B, T]
    with torch.no_grad():
        _, hidden = model(tokens, compute_logits=False)  # [B, T, d]
    batch = {"tokens": tokens, "mask": torch.ones(2, 24, dtype=torch.bool), "hidden": hidden}
    weight = lm_head_weight(model, False)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    with DefaultDeviceFactories() as mode:
        train_step(head, model, batch, optimizer, 1e-3, config, False, weight)
        evaluate(head, model, [batch], config, False, weight)
    assert mode.calls == [], sorted(set(mode.calls))
