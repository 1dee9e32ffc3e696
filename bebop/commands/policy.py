"""The policy and MTP head a job runs: `--policy DIR` (default: the embedded default) and a head spec.

`bebop rl`, `bebop train-mtp` and `bebop eval-mtp` all load here. A head spec is

    NAME   a head under ROOT/heads: the policy's directory for `load_policy` (`bebop rl`), the root a job
           passes to `resolve_head` (`bebop eval-mtp` compares the default's shipped heads); with `load_policy`,
           "e2e_tv" and "ce" also name the mtp.* head stored in the policy's own checkpoint when ROOT/heads has
           no such head
    PATH   a directory written by `bebop.models.checkpoint.save_head`

A name is tried first, so ./ce names a directory that shares a head's name. The CLIs import this module for
their help text, so torch and the checkpoint code load only when a policy does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from bebop.data.tokenizer import Tokenizer
    from bebop.models.mtp import MTPHead
    from bebop.models.transformer import Transformer

# The names that also pick the head stored in the policy's checkpoint (`bebop rl --head`'s documented choices).
HEAD_NAMES = ("e2e_tv", "ce")


def load_policy(policy: str | os.PathLike | None, head: str | None = None, *, dtype: torch.dtype | None = None
                ) -> tuple[Transformer, Tokenizer, MTPHead | None]:
    """(model, tokenizer, head or None) from checkpoint directory `policy` (None: the embedded default) and the
    head spec `head` (None: no head). `dtype` None keeps each file's stored dtype."""
    from bebop.data.tokenizer import load_tokenizer
    from bebop.default import DEFAULT_DIR
    from bebop.models.checkpoint import load_pretrained

    if policy is not None and not Path(policy).is_dir():
        raise FileNotFoundError(f"--policy {policy} is not a directory")
    root = DEFAULT_DIR if policy is None else Path(policy)
    model, stored = load_pretrained(root, dtype=dtype)
    tokenizer = load_tokenizer(root)
    return model, tokenizer, None if head is None else resolve_head(head, model, root, stored=stored, dtype=dtype)


def resolve_head(spec: str, model: Transformer, root: str | os.PathLike, *, stored: MTPHead | None = None,
                 dtype: torch.dtype | None = None) -> MTPHead:
    """The head `spec` names for `model` (see the module docstring): a name under `root`/heads, else `stored`
    (the head `model`'s checkpoint holds, if the job lets a name pick it), else a directory."""
    from bebop.default import shipped_heads
    from bebop.models.checkpoint import load_head

    names = shipped_heads(root)
    if spec in names:
        return load_head(Path(root) / "heads" / spec, model.config, dtype=dtype)
    if spec in HEAD_NAMES and stored is not None:
        return stored
    if not Path(spec).is_dir():
        raise FileNotFoundError(f"head {spec!r} is neither a directory nor a head of {root} ({names}); "
                                "--head / --heads take a head name or a save_head directory")
    return load_head(spec, model.config, dtype=dtype)
