"""Scratch memory a launch needs but does not return, kept per device and stream between calls.

Work on one stream runs in order, so every call on a stream may reuse that stream's scratch; two
streams never share it. The arrival counts must be zero before a launch: they are zeroed once when
allocated, and every launch sets the ones it used back to zero. Under CUDA graph capture a call
allocates its own (the graph's pool; the zeroing is part of the graph), so a replay never shares
scratch with eager calls or with another graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Scratch(NamedTuple):
    partials: torch.Tensor  # float64, flat: at least rows * programs * fields
    arrivals: torch.Tensor  # int32 (rows or more,), zero between launches


_SCRATCH: dict = {}  # (device, stream) -> Scratch


def _allocate(device: torch.device, partials: int, rows: int) -> Scratch:
    return Scratch(torch.empty(partials, dtype=torch.float64, device=device),
                   torch.zeros(rows, dtype=torch.int32, device=device))


def scratch(device: torch.device, stream, partials: int, rows: int) -> Scratch:
    """Scratch of at least ``partials`` float64 values and ``rows`` zero counts for a launch on
    ``stream`` (the driver's handle of the current stream) of ``device``."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _allocate(device, partials, rows)
    key = (device, stream)
    kept = _SCRATCH.get(key)
    if kept is None or kept.partials.numel() < partials or kept.arrivals.numel() < rows:
        # Grown to a power of 2, so that a few sizes serve every batch. The old scratch goes back
        # to the caching allocator, which hands it out on this stream only, after the queued work.
        kept = _SCRATCH[key] = _allocate(device, 1 << (partials - 1).bit_length(),
                                         1 << (rows - 1).bit_length())
    return kept
