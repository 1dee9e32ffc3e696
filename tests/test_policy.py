"""`--policy` and `--head` / `--heads` anywhere on the command line (issue 18, item 2): a policy is the embedded
default, a directory or a hub id; a head is one saved beside the policy, the one embedded in its checkpoint, or a
save_head directory, by the same rules in every job."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_checks import one_error_line

from bebop.cli import main
from bebop.commands import demo
from bebop.data.tokenizer import load_tokenizer
from bebop.default import DEFAULT_DIR
from bebop.models import ModelConfig, Transformer
from bebop.models.checkpoint import save_head, save_pretrained
from bebop.models.mtp import MTPHead
from bebop.policy import EMBEDDED, check_policy, load_policy, load_policy_heads, resolve_heads

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 256}


def _config(**overrides) -> ModelConfig:
    return ModelConfig.tiny(vocab_size=load_tokenizer(DEFAULT_DIR).vocab_size, **{**SHAPE, **overrides})


def _head(config: ModelConfig, objective: str, seed: int) -> MTPHead:
    torch.manual_seed(seed)
    return MTPHead(config, objective=objective)


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> dict:
    """"full": a random policy whose checkpoint embeds a "ce" head and which has heads/x (e2e_tv) beside it;
    "bare": the same policy with no head at all."""
    root = tmp_path_factory.mktemp("policies")
    torch.manual_seed(0)
    config = _config()
    model = Transformer(config)
    heads = {"embedded": _head(config, "ce", 1), "x": _head(config, "e2e_tv", 2)}
    save_pretrained(model, root / "full", mtp=heads["embedded"])
    save_pretrained(model, root / "bare")
    for name in ("full", "bare"):
        load_tokenizer(DEFAULT_DIR).save(root / name)
    save_head(heads["x"], root / "full" / "heads" / "x")
    save_head(_head(_config(hidden_size=48, head_dim=24), "ce", 3), root / "wide")  # for another backbone
    return {"root": root, "full": root / "full", "bare": root / "bare", "heads": heads}


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_a_policy_is_the_default_a_directory_or_a_hub_id(policies, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # "~/nope" must not depend on the user's home either
    assert check_policy(None) == DEFAULT_DIR
    assert check_policy(str(policies["full"])) == policies["full"]
    for hub_id in ("Qwen/Qwen3-0.6B", "org/name.v1"):
        assert check_policy(hub_id) == hub_id
    # a name without "/" is never sent to the hub (far likelier a mistyped directory): one line, no network
    for typed in (str(tmp_path / "nope"), "./nope", "../nope", "~/nope", "a/b/c", "runs/", "gpt2", "no-such-dir"):
        with pytest.raises(FileNotFoundError, match="no such directory"):
            check_policy(typed)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="is a file"):
        check_policy(tmp_path / "model.safetensors")


def test_every_head_route_of_load_policy(policies):
    heads, full = policies["heads"], policies["full"]
    routes = {"x": heads["x"], EMBEDDED: heads["embedded"], "ce": heads["embedded"],  # the embedded head's objective
              str(full / "heads" / "x"): heads["x"]}
    for spec, want in routes.items():
        _, tokenizer, head = load_policy(full, spec)
        assert _same(head, want), spec
    assert load_policy(full)[2] is None
    assert tokenizer.encode("1+2") == load_tokenizer(DEFAULT_DIR).encode("1+2")


def test_a_head_beside_the_policy_shadows_the_embedded_objective(policies, tmp_path):
    shadow = tmp_path / "shadow"
    save_pretrained(load_policy(policies["full"])[0], shadow, mtp=policies["heads"]["embedded"])
    load_tokenizer(DEFAULT_DIR).save(shadow)
    save_head(policies["heads"]["x"], shadow / "heads" / "ce")
    assert _same(load_policy(shadow, "ce")[2], policies["heads"]["x"])
    assert _same(load_policy(shadow, EMBEDDED)[2], policies["heads"]["embedded"])


def test_a_wrong_name_lists_what_exists(policies):
    with pytest.raises(FileNotFoundError, match=r"'e2e_tv'.*heads \(\['x'\]\) nor its checkpoint's "
                                                r"\('embedded' or 'ce'\)"):
        load_policy(policies["full"], "e2e_tv")
    with pytest.raises(FileNotFoundError, match=r"heads \(\[\]\) nor its checkpoint's \(it stores none\)"):
        load_policy(policies["bare"], EMBEDDED)


def test_a_head_for_another_backbone_names_both_shapes(policies):
    with pytest.raises(ValueError, match=r"hidden_size 48 \(head\) != 32 \(policy\)"):
        load_policy(policies["full"], str(policies["root"] / "wide"))


def test_eval_mtp_heads_are_looked_up_beside_the_policy(policies):
    model, _, _ = load_policy(policies["bare"])
    heads = resolve_heads(["x", f"mine={policies['full'] / 'heads' / 'x'}"], model, root=policies["full"])
    assert list(heads) == ["x", "mine"] and all(_same(h, policies["heads"]["x"]) for h in heads.values())
    bundle = load_policy_heads(policies["full"], ["x", EMBEDDED, "first=ce"])
    assert list(bundle.heads) == ["x", EMBEDDED, "first"] and bundle.path == policies["full"]
    assert _same(bundle.heads["first"], policies["heads"]["embedded"])
    every = load_policy_heads(policies["full"])  # no specs: the heads saved beside the policy (notebooks' default)
    assert list(every.heads) == ["x"] and _same(every.heads["x"], policies["heads"]["x"])
    assert load_policy_heads(policies["bare"]).heads == {}
    with pytest.raises(ValueError, match=r"\['x'\] more than once"):
        resolve_heads(["x", f"{policies['full'] / 'heads' / 'x'}"], model, root=policies["full"])
    with pytest.raises(FileNotFoundError, match="heads"):  # the default's heads are not the given policy's
        resolve_heads(["tv"], model, root=policies["full"])


def test_eval_mtp_runs_on_a_random_policy_with_its_own_heads(policies, tmp_path):
    run = tmp_path / "run"
    argv = ["eval-mtp", "--policy", str(policies["full"]), "--heads", f"mine={policies['full'] / 'heads' / 'x'}",
            EMBEDDED, "--temperatures", "1.0", "--num-prompts", "2", "--max-new-tokens", "8", "--methods", "rs",
            "--tasks", "math", "--gamma", "2", "--dtype", "fp32", "--threads", "1", "--run-dir", str(run)]
    assert main(argv) == 0
    rows = json.loads((run / "table.json").read_text())
    assert [r["head"] for r in rows] == ["mine", EMBEDDED]


def test_demo_takes_any_policy_and_head(policies, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--policy", str(policies["full"]), "--head", EMBEDDED, "--steps", "2", "--prompts", "1",
                              "--group", "2", "--max-new-tokens", "8", "--out", str(tmp_path), "--threads", "1"])
    assert demo.run(args) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps to the table
    assert f"(policy {policies['full']}, {EMBEDDED} head, frozen)" in out  # the table's title names both
    assert re.search(r"wall time: \d+ min \d+ s", out)
    assert re.search(r"groups with a reward signal +│ +\d+% +│ +\d+%", out)
    assert sorted(p.name for p in next(tmp_path.iterdir()).iterdir()) == [f"rows2-mtp-rs-{EMBEDDED}", "rows2-no-mtp"]


@pytest.mark.parametrize("command", [["rl", "--steps", "1"], ["eval-mtp"], ["demo"], ["bench", "rl"]])
def test_misused_heads_are_one_line_on_every_job(policies, tmp_path, capsys, command):
    flag = "--heads" if command[0] in ("eval-mtp", "bench") else "--head"
    out = ["--out", str(tmp_path / "run")] if command[0] in ("rl", "demo") else []
    base = command + out + ["--policy", str(policies["full"]), flag]
    assert main(base + ["nope"]) == 2
    assert "['x']" in one_error_line(capsys)
    assert main(base + [str(policies["root"] / "wide")]) == 2
    assert "hidden_size 48 (head) != 32 (policy)" in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_hub_id_offline_is_one_clear_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "bebop", "rl", "--out", str(tmp_path / "run"), "--policy",
                           "bebop-tests/no-such-model", "--steps", "1", "--no-progress"],
                          check=False, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bebop: error: ") and "bebop-tests/no-such-model" in lines[0]
    assert not (tmp_path / "run").exists()


def test_bench_engine_times_a_policy_with_its_own_head(policies, tmp_path, monkeypatch):
    from bebop.commands.bench import engine

    def no_self_draft(*args, **kwargs):
        raise AssertionError("--policy alone built a random-init self-draft pair")

    monkeypatch.setattr(engine, "self_draft_pair", no_self_draft)
    path = tmp_path / "engine.json"
    assert main(["bench", "engine", "--policy", str(policies["full"]), "--head", "x", "--batch", "1", "--gamma", "2",
                 "--new-tokens", "8", "--prompt-len", "4", "--repeats", "1", "--no-compile", "--dtype", "fp32",
                 "--threads", "1", "--json", str(path)]) == 0
    records = json.loads(path.read_text())
    assert {r["model"] for r in records} == {"policy"}  # --policy alone times no random-init shape
    assert {(r["engine"], r["mode"]) for r in records} == {("bebop", "plain"), ("bebop", "to"), ("bebop", "rs"),
                                                           ("hf", "plain"), ("hf", "assisted")}
    assert all(0 <= r["acceptance_rate"] <= 1 for r in records if r["mode"] in ("to", "rs"))


def test_bench_engine_checks_the_head_before_timing_anything(policies, monkeypatch, capsys):
    from bebop.commands.bench import engine

    def no_timing(*args, **kwargs):
        raise AssertionError("a model was timed before the head was found")

    monkeypatch.setattr(engine, "bench_model", no_timing)
    assert main(["bench", "engine", "--models", "tiny", "--policy", str(policies["full"]), "--head", "nope"]) == 2
    assert "['x']" in one_error_line(capsys)


def test_rl_runs_with_the_embedded_head_of_a_random_policy(policies, tmp_path):
    run = tmp_path / "run"
    assert main(["rl", "--out", str(run), "--policy", str(policies["full"]), "--head", EMBEDDED, "--steps", "1",
                 "--no-progress", "--threads", "1"]) == 0
    meta = json.loads((run / "meta.json").read_text())
    assert (meta["head"]["name"], meta["head"]["objective"]) == (EMBEDDED, "ce")  # the spec as given, the stored loss
    assert meta["policy"]["name"] == str(policies["full"])


def test_get_model_replaces_only_untouched_earlier_shipped_heads(policies, tmp_path, monkeypatch, capsys):
    """A new bebop version's shipped heads replace the copies an earlier version installed (their hash is in
    superseded.json), never a head the user trained or edited under the same name, and fill in missing ones."""
    import hashlib
    import shutil

    from bebop import policy

    config = _config()
    assets = tmp_path / "assets"
    save_head(_head(config, "ce", 10), assets / "heads" / "ce")  # this version's ce and e2e_tv
    save_head(_head(config, "e2e_tv", 11), assets / "heads" / "e2e_tv")
    out = tmp_path / "installed"
    shutil.copytree(policies["bare"], out)
    save_head(_head(config, "ce", 20), out / "heads" / "ce")  # an earlier version's ce, untouched
    save_head(_head(config, "e2e_tv", 21), out / "heads" / "e2e_tv")  # the user's own e2e_tv
    old = hashlib.sha256((out / "heads" / "ce" / "head.safetensors").read_bytes()).hexdigest()
    (assets / "heads" / "superseded.json").write_text(json.dumps({"ce": [old], "e2e_tv": ["0" * 64]}))
    mine = (out / "heads" / "e2e_tv" / "head.safetensors").read_bytes()
    monkeypatch.setattr(policy, "SMOLLM2_ASSETS", assets)

    policy._install_heads(out)
    shipped = (assets / "heads" / "ce" / "head.safetensors").read_bytes()
    assert (out / "heads" / "ce" / "head.safetensors").read_bytes() == shipped
    assert (out / "heads" / "e2e_tv" / "head.safetensors").read_bytes() == mine
    assert "replacing the earlier shipped head" in capsys.readouterr().out
    shutil.rmtree(out / "heads" / "e2e_tv")
    policy._install_heads(out)  # a missing head is installed; nothing else is touched or said again
    assert (out / "heads" / "e2e_tv" / "head.safetensors").read_bytes() == \
        (assets / "heads" / "e2e_tv" / "head.safetensors").read_bytes()
    assert "replacing" not in capsys.readouterr().out
