"""Launching every sampler's Triton kernels: each specialisation compiled and loaded once, then the
compiled kernel launched.

``kernel[grid](...)`` binds the arguments, derives the specialisation from their values and looks
the compiled kernel up on every call: most of a launch's host time. A ``TritonKernel`` binds once
per specialisation: its caller names the specialisation with a key of what Triton specialises on
that its argument checks do not already fix (dtypes, constexpr values, alignment: ``alignment``),
tests/test_launch.py checks that every key field selects what Triton's own binder selects, and
each specialisation comes from ``JITFunction.warmup`` (Triton's own compile and cache) and is then
launched as ``CompiledKernel[grid]`` does.

What ``kernel[grid]`` reads on every call besides the arguments is honoured: while launch hooks,
a kernel's pre-run hooks or a setting that changes how kernels are compiled (``TRITON_DEBUG``, the
instrumentation and sanitizer knobs) are set, every launch goes through ``kernel[grid]``. Under
``TRITON_INTERPRET=1`` there are no compiled kernels, and every launch is ``kernel[grid]``.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton

_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_KNOBS = getattr(triton, "knobs", None)  # Triton >= 3.4; earlier releases read the environment


def _active(hook) -> bool:
    # A hook is None or a function in older releases; in newer ones a chain, empty by default.
    return hook is not None and bool(getattr(hook, "calls", True))


if _KNOBS is not None:
    _RUNTIME, _COMPILATION = _KNOBS.runtime, _KNOBS.compilation
    # The per-call compile knobs this release has, beside TRITON_DEBUG.
    _COMPILE_KNOBS = tuple(name for name in ("instrumentation_mode", "fpsan_homomorphic_casts")
                           if hasattr(_COMPILATION, name))

    def observed() -> bool:
        """Whether something ``kernel[grid]`` reads on every call besides the arguments is set:
        launch hooks, or a setting that changes how kernels are compiled."""
        if (_active(_RUNTIME.launch_enter_hook) or _active(_RUNTIME.launch_exit_hook)
                or _RUNTIME.debug):
            return True
        for name in _COMPILE_KNOBS:
            if getattr(_COMPILATION, name):
                return True
        return getattr(_RUNTIME, "add_stages_inspection_hook", None) is not None
else:  # releases before the knobs module: hooks on CompiledKernel, debug from the environment
    def observed() -> bool:
        from triton.compiler.compiler import CompiledKernel

        return (_active(CompiledKernel.launch_enter_hook)
                or _active(CompiledKernel.launch_exit_hook)
                or os.environ.get("TRITON_DEBUG", "0") == "1")


def build_options(num_warps: int, **more) -> dict:
    """How every sampler's kernels are built: ``num_warps`` warps, one stage, and no multiply-add
    contraction, so that every float operation rounds as the torch reference's does."""
    return {"num_warps": num_warps, "num_stages": 1, "enable_fp_fusion": False, **more}


# Row passes over 1024-value chunks: 128 threads x 8 values, 16-byte loads even for bf16/fp16.
FOUR_WARPS = build_options(4)


def alignment(addresses: tuple, ints: tuple) -> object:
    """What Triton specialises pointer addresses (16-byte alignment) and integers (16-divisibility,
    the value 1, the 32-bit range) on, as one small hashable value: True when every address and
    integer is 16-divisible and every integer in [0, 2**31) (the common case), else each one's
    class."""
    low_bits, ints_or = 0, 0
    for address in addresses:
        low_bits |= address
    for value in ints:
        ints_or |= value
    if (low_bits | ints_or) % 16 == 0 and 0 <= ints_or < 2**31:
        return True
    return (tuple(a % 16 == 0 for a in addresses),
            tuple((v % 16 == 0, v == 1, -2**31 <= v < 2**31) for v in ints))


@functools.lru_cache(maxsize=64)
def placeholder(device, dtype) -> torch.Tensor:
    """A one-element tensor for a pointer argument a launch never dereferences (or a lookup made
    before the real tensor exists), of the dtype the real one has, so that both select the same
    specialisation."""
    return torch.empty(1, dtype=dtype, device=device)


def current_stream(device: int):
    """The driver's handle of the current stream on ``device``, what a launch is queued on."""
    return triton.runtime.driver.active.get_current_stream(device)


def direct_launch(*kernels: "TritonKernel") -> bool:
    """Whether these kernels may be launched without kernel[grid] now: no launch hooks, compile
    settings or pre-run hooks that kernel[grid] would honour (one question for a call's
    kernels)."""
    if observed():
        return False
    for kernel in kernels:
        if kernel.fn.pre_run_hooks:
            return False
    return True


class Compiled(NamedTuple):
    """One loaded specialisation: the compiled kernel and what a launch plan needs of it."""

    kernel: object  # triton CompiledKernel
    device: int  # the device it is loaded on
    registers: int  # per thread
    shared: int  # bytes of shared memory per program
    num_warps: int
    takes_constexprs: bool  # whether its launcher takes the constexpr arguments too


class TritonKernel:
    """A ``@triton.jit`` function with the options it is always built with, launched through its
    compiled specialisations. ``args`` are the function's runtime arguments in order and
    ``constexprs`` the values of its constexpr parameters, which come last, in order."""

    def __init__(self, fn, **options):
        self.fn = fn
        self.options = options
        self._compiled: dict[tuple, Compiled] = {}

    def compiled(self, key: tuple, args, constexprs: tuple, device: int | None = None
                 ) -> Compiled | None:
        """The specialisation ``key`` names (the caller's: everything Triton specialises these
        arguments on), compiled and loaded on ``device`` (default: the current one); None under
        the interpreter. The first call of a specialisation compiles or loads it."""
        if _INTERPRETED:
            return None
        if device is None:
            device = triton.runtime.driver.active.get_current_device()
        compiled = self._compiled.get((device, key))
        if compiled is None:
            compiled = self._compiled[device, key] = self._load(device, args, constexprs)
        return compiled

    def _load(self, device, args, constexprs) -> Compiled:
        kernel = self.fn.warmup(*args, *constexprs, grid=(1,), **self.options)
        kernel._init_handles()  # loads it, and reads its registers (as Triton's tutorials do)
        # Releases before 3.3 launch compiled kernels with the non-constexpr arguments only.
        takes_constexprs = len(kernel.src.signature) == len(self.fn.params)
        return Compiled(kernel, device, kernel.n_regs, kernel.metadata.shared,
                        kernel.metadata.num_warps, takes_constexprs)

    def launch(self, grid: tuple, compiled: Compiled | None, args, constexprs: tuple,
               direct: bool | None = None, stream=None) -> None:
        """Launch ``compiled`` (what ``compiled`` returned for these arguments) on ``grid`` (1 to
        3 dimensions); ``direct``: ``direct_launch(...)`` for this kernel, and ``stream``:
        ``current_stream(compiled.device)``, where the caller already asked."""
        if direct is None:
            direct = direct_launch(self)
        if compiled is None or not direct:
            self.fn[grid](*args, *constexprs, **self.options)
            return
        if compiled.takes_constexprs:
            args = (*args, *constexprs)
        grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
        kernel = compiled.kernel
        if stream is None:
            stream = current_stream(compiled.device)
        # The call CompiledKernel[grid] and JITFunction.run make, less the launch metadata and
        # hooks, which only launch hooks read (with hooks set, launches take kernel[grid] above).
        kernel.run(grid_x, grid_y, grid_z, stream, kernel.function, kernel.packed_metadata, None,
                   None, None, *args)
