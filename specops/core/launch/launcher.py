"""Launching every sampler's Triton kernels, as Triton's users do: ``kernel[grid](...)``.

A ``TritonKernel`` is a ``@triton.jit`` function (``.fn``) with the options it is always built with
(``.options``, from ``build_options``); every launch is ``kernel.fn[grid](*args, **constexprs,
**kernel.options)``, so Triton binds the arguments, picks and caches the specialisation and honours
its hooks and settings on every call.

A launch plan (``core/launch/occupancy.py``) needs the registers and shared memory of the compiled kernel
a launch will run. ``TritonKernel.resources`` reads them as Triton's fused-softmax tutorial does:
``JITFunction.warmup`` compiles (or finds in Triton's cache) the kernel the arguments select,
``_init_handles()`` loads it, and ``n_regs`` and ``metadata.shared`` are read; once per device and
choice of constexprs and argument dtypes (what selects the kernel's code; the alignment Triton also
specialises on barely moves a kernel's registers). Under ``TRITON_INTERPRET=1`` there is no
compiled kernel: ``resources`` gives None and a plan is one program per row.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton

_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def build_options(num_warps: int, **more) -> dict:
    """How every sampler's kernels are built: ``num_warps`` warps, one stage, and no multiply-add
    contraction, so that every float operation rounds as the torch reference's does."""
    return {"num_warps": num_warps, "num_stages": 1, "enable_fp_fusion": False, **more}


# Row passes over 1024-value chunks: 128 threads x 8 values, 16-byte loads even for bf16/fp16.
FOUR_WARPS = build_options(4)


@functools.lru_cache(maxsize=64)
def placeholder(device, dtype) -> torch.Tensor:
    """A one-element tensor for a pointer argument the kernel never reads (statistics without
    logits, partials with one program per row), of the dtype the kernel is compiled for."""
    return torch.empty(1, dtype=dtype, device=device)


class Resources(NamedTuple):
    """What a launch plan reads of one compiled kernel, and the device it is loaded on."""

    device: int
    registers: int  # per thread
    shared: int  # bytes of shared memory per program
    num_warps: int
    kernel: object  # the triton CompiledKernel they were read from


class TritonKernel:
    """A ``@triton.jit`` function and the options it is always built with (tests/sass.py compiles
    each kernel with these)."""

    def __init__(self, fn, **options):
        self.fn = fn
        self.options = options
        self._resources: dict[tuple, Resources] = {}

    def resources(self, *args, **constexprs) -> Resources | None:
        """The resources of the kernel a launch on ``args`` (the runtime arguments, in order) and
        ``constexprs`` (by name) runs, compiled and loaded on the current device by the first
        call for its device, constexprs and argument dtypes; None under the interpreter."""
        if _INTERPRETED:
            return None
        device = triton.runtime.driver.active.get_current_device()
        key = (device, tuple(constexprs.items()), tuple(getattr(a, "dtype", None) for a in args))
        found = self._resources.get(key)
        if found is None:
            kernel = self.fn.warmup(*args, grid=(1,), **constexprs, **self.options)
            kernel._init_handles()  # loads it, which reads its registers
            found = self._resources[key] = Resources(device, kernel.n_regs,
                                                     kernel.metadata.shared,
                                                     kernel.metadata.num_warps, kernel)
        return found
