"""Scratch memory a launch needs but does not return: float64 row-pass partials, and int32 arrival
counts that are zero between launches (each launch sets the ones it used back to zero); token
verification's kernel combines its programs' partials through them (docs/kernel.md).

A plain eager call of a public function keeps its scratch between calls, per thread, device and
stream: work on one stream runs in order, so the calls on a stream may share it, and two streams
never do. Any other call allocates its own (the counts zeroed by a fill): a call that something
may record runs where allocations can belong to a graph's private memory pool, which must not
outlive the graph or be shared with it: under CUDA graph capture, and in a ``torch.compile``d
graph whose warm-up runs before its capture (``mode="reduce-overhead"``) with its allocations
already drawn from that pool.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from .backends import device_type


class Scratch(NamedTuple):
    partials: torch.Tensor  # float64, flat: at least rows * programs * fields
    arrivals: torch.Tensor  # int32 (rows or more,), zero between launches


_KEPT = threading.local()  # .scratch: {(device, stream): Scratch} of this thread's plain calls


def _allocate(device: torch.device, partials: int, rows: int) -> Scratch:
    return Scratch(torch.empty(partials, dtype=torch.float64, device=device),
                   torch.zeros(rows, dtype=torch.int32, device=device))


def scratch(device: torch.device, stream, partials: int, rows: int, keep: bool) -> Scratch:
    """Scratch of at least ``partials`` float64 values and ``rows`` zero counts for a launch on
    ``stream`` (the driver's handle of the current stream) of ``device``: kept between calls where
    ``keep`` (a plain eager call) and no CUDA graph is being captured, else the call's own."""
    if not keep or (device_type(device) == "cuda" and torch.cuda.is_current_stream_capturing()):
        return _allocate(device, partials, rows)
    kept = getattr(_KEPT, "scratch", None)
    if kept is None:
        kept = _KEPT.scratch = {}
    key = (device, stream)
    found = kept.get(key)
    if found is None or found.partials.numel() < partials or found.arrivals.numel() < rows:
        # Grown to a power of 2, so that a few sizes serve every batch. The old scratch goes back
        # to the caching allocator, which hands it out on this stream only, after the queued work.
        found = kept[key] = _allocate(device, 1 << (partials - 1).bit_length(),
                                      1 << (rows - 1).bit_length())
    return found
