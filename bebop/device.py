"""Device and dtype defaults, and what this CPU can do in bf16.

bf16 *works* on every CPU; how fast depends on the instructions oneDNN finds:

  * native bf16 dot products (AVX512-BF16 or AMX): bf16 matmuls are 3-5x faster than fp32, and bebop packs bf16
    linear weights for oneDNN once (bebop.models.prepack). `auto` picks bf16.
  * AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT without them: oneDNN converts bf16 in software; packing works, bf16 is
    not faster than fp32. `auto` picks fp32.
  * AVX2 only: oneDNN refuses bf16 (packing raises), so bf16 matmuls run ATen's reference kernels: correct,
    slow. `auto` picks fp32; an explicit bf16 runs unpacked.

`cpu_bf16_packing()` asks oneDNN itself (one tiny trial packing, cached), so it is right on CPUs whose flags
this module does not know and under `ONEDNN_MAX_CPU_ISA`, which CI uses to run the AVX2 path on an AVX-512
machine. `BEBOP_CPU_BF16_PACKING=0` turns packing off (and `=1` skips the trial), whatever the CPU.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported where it is used, so that a job's config checks a device name (`check_device_name`) before torch
# loads: a misuse answers at once.
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # a dtype name -> torch's
PACKING_SWITCH = "BEBOP_CPU_BF16_PACKING"


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(word for line in f if line.startswith("flags") for word in line.split()[2:])
    except OSError:
        return frozenset()


@functools.lru_cache(maxsize=None)
def onednn_bf16_works() -> bool:
    """Whether oneDNN runs bf16 linears on this CPU: one tiny trial of the packing bebop.models.prepack uses. Its refusal
    ("bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq") is how oneDNN says so."""
    import torch

    try:
        if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
            return False
        weight = torch.ones(2, 2, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2, dtype=torch.bfloat16), packed, None, "none", [], "")
        return bool((out == 2).all())
    except (AttributeError, RuntimeError):
        return False


def cpu_bf16_packing() -> bool:
    """Whether bebop.models.prepack packs CPU bf16 linear weights: oneDNN's answer, unless BEBOP_CPU_BF16_PACKING forces
    it ("0" off, "1" on without the trial). Read on every call, so a test or a job can flip it."""
    forced = os.environ.get(PACKING_SWITCH, "").strip()
    if forced not in ("", "0", "1"):
        raise ValueError(f"{PACKING_SWITCH} must be 0 or 1 (or unset: ask oneDNN), got {forced!r}")
    return forced == "1" if forced else onednn_bf16_works()


@functools.lru_cache(maxsize=None)
def cpu_has_fast_bf16() -> bool:
    """True when bf16 beats fp32 here: native bf16 dot products (AVX512-BF16 or AMX) that oneDNN also uses
    (`onednn_bf16_works`, which `ONEDNN_MAX_CPU_ISA` can deny). Elsewhere bf16 is emulated and slower than fp32."""
    return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags()) and onednn_bf16_works()


def default_device() -> torch.device:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device | str | None = None) -> torch.dtype:
    import torch

    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":  # fp16 would need loss scaling in every trainer: GPUs without bf16 run fp32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def resolve_dtype(name: str | torch.dtype | None, device: torch.device | str | None = None) -> torch.dtype:
    """"auto" / None -> default_dtype(device); "fp32" | "bf16" | "fp16" or a torch.dtype as given."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        return default_dtype(device)
    if name not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {name!r}")
    return getattr(torch, DTYPES[name])


def check_device_name(name: str) -> str:
    """`name` if it is "auto", "cpu", "cuda" or "cuda:N"; ValueError otherwise (no CUDA needed to check the form)."""
    if not isinstance(name, str) or not (name in ("auto", "cpu", "cuda") or
                                         (name.startswith("cuda:") and name[5:].isdigit())):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return name


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """The device a job runs on. "auto" / None: CUDA when present (under torchrun, this rank's LOCAL_RANK GPU),
    else the CPU. "cuda" likewise picks LOCAL_RANK's GPU. A CUDA device this machine lacks is one ValueError line,
    raised before anything loads."""
    import torch

    if isinstance(name, torch.device):
        name = str(name)
    name = check_device_name("auto" if name is None else name)
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (torch {torch.__version__}, "
                         f"built {'with' if torch.version.cuda else 'without'} CUDA); use --device cpu or auto")
    index = int(name[5:]) if name.startswith("cuda:") else int(os.environ.get("LOCAL_RANK", "0"))
    if index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def autocast(device: torch.device | str, dtype: torch.dtype):
    """Mixed precision on `device`'s type: float32 master weights, matmuls in `dtype` (off when it is float32)."""
    import torch

    device_type = torch.device(device).type
    return torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32)


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device`; to CUDA through pinned memory, so the copy does not stall the host."""
    import torch

    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
