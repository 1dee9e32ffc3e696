"""The jobs on a GPU (`--device cuda`): a 2-step `rl`, a 10-step `train-mtp` and an `eval-mtp` through the CLI, and the
GRPO update on CUDA equal to the same update on the CPU. Skipped without CUDA; `scripts/gpu-check` runs them."""

from __future__ import annotations

import copy

import pytest
import torch
from test_rl import MODEL, Digits

from bebop.cli import main
from bebop.data.tokenizer import CharTokenizer
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.rl import RLConfig, build_trainer
from bebop.runlog import load_run

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_rl_two_steps_on_cuda(tmp_path):
    out = tmp_path / "rl"
    assert main(["rl", "--preset", "quick", "--steps", "2", "--device", "cuda", "--out", str(out), "--sync",
                 "--no-progress"]) == 0
    run = load_run(out)
    assert run.streams["train"]["step"].tolist() == [0, 1]
    assert run.meta["config"]["device"] == "cuda"
    assert (out / "checkpoint.pt").is_file()


def test_train_mtp_ten_steps_and_eval_mtp_on_cuda(tmp_path):
    head = tmp_path / "head"
    assert main(["train-mtp", "--device", "cuda", "--tasks", "math", "--num-sequences", "16", "--max-new-tokens", "32",
                 "--steps", "10", "--batch-size", "4", "--eval-every", "5", "--depth", "3", "--out", str(head),
                 "--run-dir", str(tmp_path / "mtp")]) == 0
    train = load_run(tmp_path / "mtp").streams["train"]
    assert train["step"].tolist() == list(range(10)) and train["mtp/loss/e2e_tv"].notna().all()
    assert main(["eval-mtp", "--device", "cuda", "--heads", f"new={head}", "e2e_tv", "--num-prompts", "8",
                 "--max-new-tokens", "32", "--temperatures", "0.5", "1.0", "1.5",
                 "--run-dir", str(tmp_path / "eval")]) == 0
    assert (tmp_path / "eval" / "table.csv").is_file() or any((tmp_path / "eval").iterdir())


def test_the_update_on_cuda_equals_the_update_on_the_cpu(tmp_path):
    """The same batch, fp32 both sides: loss, gradient norm and the updated weights agree to float tolerance."""
    tok = CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL)
    model, head = Transformer(config), MTPHead(config)
    results = {}
    for device in ("cpu", "cuda"):
        rl = RLConfig.tiny(method="rs", mtp="online-tv", device=device, dtype="fp32")
        trainer = build_trainer(rl, copy.deepcopy(model), tok, head=copy.deepcopy(head), run_dir=tmp_path / device,
                                task=Digits())
        assert trainer.policy.lm_head.weight.device.type == device
        batch = results["batch"] if "batch" in results else trainer._generate(0, 0)
        results.setdefault("batch", batch)
        metrics = trainer.update(batch).metrics
        results[device] = (metrics, {k: v.detach().cpu() for k, v in trainer.policy.state_dict().items()})
        trainer.writer.close()
    (cpu, cpu_weights), (cuda, cuda_weights) = results["cpu"], results["cuda"]
    for key in ("actor/loss", "actor/grad_norm", "mtp/loss/e2e_tv"):
        assert cuda[key] == pytest.approx(cpu[key], rel=1e-3, abs=1e-5), key
    # The tolerance of the weights, derived: the trainer's AdamW (no weight decay) moves each weight on its first step
    # by lr * g / (|g| + eps), bias correction making m^ = g and v^ = g^2: at most lr, in g's sign. A gradient well
    # above the two devices' rounding gets the same step on both, up to the fp32 rounding of w + step; one within that
    # rounding of 0 may get steps of opposite signs, 2 lr apart. So 2 lr plus the rounding bounds every weight whatever
    # the gradients are (it cannot fail by chance), and a step larger than lr, on either device, exceeds it.
    lr = rl.lr  # the same config on both devices
    initial = {name: w.detach().clone() for name, w in model.state_dict().items()}
    for name, weight in cpu_weights.items():
        rounding = 4 * torch.finfo(torch.float32).eps * weight.abs()  # [...] fp32 rounding of w + step, both sides
        assert ((cuda_weights[name] - weight).abs() <= 2 * lr + rounding).all(), name
        for weights in (cpu_weights, cuda_weights):
            assert ((weights[name] - initial[name]).abs() <= lr + rounding).all(), name  # AdamW's first step
    for weights in (cpu_weights, cuda_weights):  # each device took the step
        assert max((w - initial[n]).abs().max() for n, w in weights.items()) > lr / 2
