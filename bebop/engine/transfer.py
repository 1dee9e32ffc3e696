"""Host <-> device copies of the engine's small tables, without hidden synchronisation on CUDA.

A blocking host->device copy from pageable memory synchronises the stream, and `.tolist()` of a CUDA tensor is a
synchronising device->host copy. The engine's tables (row indices, prompt feeds) go up from pinned memory with
`non_blocking=True`, so they queue behind the step's kernels; the one table that comes back per step (the host
table of bebop.engine.step) is copied into pinned memory asynchronously and waited for through an event, which is
the step's one marked host sync. On CPU both are plain copies.
"""

from __future__ import annotations

import torch

from bebop.device import to_device


def upload(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (a list, nested for 2-D) as a tensor on `device`; on CUDA through pinned memory, asynchronously (the
    pinned source is kept alive by the caching host allocator until the queued copy ran)."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as a CPU tensor, waiting for exactly the kernels it depends on (an event, not a stream sync)."""
    if tensor.device.type != "cuda":
        return tensor
    out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    out.copy_(tensor, non_blocking=True)  # queued on the current stream of the tensor's device
    # That stream, named: the thread's current device may be another GPU (--device cuda:1, a rollout thread), whose
    # stream would not carry the copy, and the host would read the table before it lands.
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(tensor.device))
    done.synchronize()
    return out
