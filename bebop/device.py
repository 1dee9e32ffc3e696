"""Device and dtype defaults: bf16 where the hardware runs it fast, fp32 elsewhere."""

from __future__ import annotations

import functools

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@functools.lru_cache(maxsize=None)
def cpu_has_fast_bf16() -> bool:
    """True when the CPU has native bf16 dot products (AVX512-BF16 or AMX), where oneDNN's bf16 matmuls
    beat fp32 by 3-5x; without them bf16 is emulated and slower than fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device | str | None = None) -> torch.dtype:
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def resolve_dtype(name: str | torch.dtype | None, device: torch.device | str | None = None) -> torch.dtype:
    """"auto" / None -> default_dtype(device); "fp32" | "bf16" | "fp16" or a torch.dtype as given."""
    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        return default_dtype(device)
    if name not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]
