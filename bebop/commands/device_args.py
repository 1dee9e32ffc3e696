"""`--device` and `--dtype`, the same on every command: parsed and checked before anything loads.

    --device auto | cpu | cuda | cuda:N   auto = CUDA when present (under torchrun: the rank's LOCAL_RANK GPU)
    --dtype  auto | bf16 | fp32           auto = bf16 on CUDA and on CPUs with native bf16, else fp32

`device_and_dtype(args)` resolves both: `--device cuda` on a machine without CUDA is one ValueError line, which
`bebop.cli` prints with exit status 2.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bebop.device import check_device_name

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("auto", "bf16", "fp32")


def add_device_args(parser: argparse.ArgumentParser, *, dtype_help: str = "the compute dtype",
                    dtype_aliases: tuple[str, ...] = (), dtype_default: str | None = "auto") -> None:
    """`--device` and `--dtype` (also spelled as `dtype_aliases`, a command's older name for it). `dtype_default`
    None leaves it to the command (a preset's value)."""
    parser.add_argument("--device", default="auto", type=_device_name,
                        help="auto | cpu | cuda | cuda:N; auto = CUDA when present, else the CPU (default: %(default)s)")
    default = "%(default)s" if dtype_default is not None else "the preset's"
    parser.add_argument("--dtype", *dtype_aliases, dest="dtype", default=dtype_default, choices=DTYPE_NAMES,
                        help=f"{dtype_help} (default: {default}); auto picks bf16 on CUDA and on CPUs with native "
                             "bf16, else fp32")


def _device_name(value: str) -> str:
    try:
        return check_device_name(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def device_and_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """(device, dtype) of `args.device` / `args.dtype`; ValueError when the device is not on this machine."""
    from bebop.device import resolve_device, resolve_dtype  # torch: once the flags are checked

    device = resolve_device(args.device)
    return device, resolve_dtype(args.dtype, device)
