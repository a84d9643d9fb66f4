"""Launching an already-loaded Triton specialisation without Triton's argument binder.

``kernel[grid](...)`` binds the arguments, derives the specialisation key from their values and
looks the compiled kernel up on every call: most of a launch's host time.  A caller that can tell
its specialisation from a few properties of its own (dtypes, alignment) keeps the compiled kernel
the first launch returned and calls its launcher directly, as ``JITFunction.run`` does after the
lookup.  That call's convention has changed across Triton releases, so the direct path is used only
where the installed ``JITFunction.run`` makes it the same way (``direct_launch_supported``);
elsewhere, and while a profiler's launch hooks are set, callers take ``kernel[grid]``.
"""

from __future__ import annotations

import functools
import inspect
import os

import triton

# How JITFunction.run (Triton 3.4 to 3.9 at least) calls the launcher after its cache lookup:
# every argument, constexprs included, in signature order.
_CALL = ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
         "launch_metadata,")


@functools.lru_cache(maxsize=1)
def direct_launch_supported() -> bool:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False  # the interpreter has no compiled kernels
    try:
        from triton import knobs
        from triton.runtime.jit import JITFunction

        source = inspect.getsource(JITFunction.run)
        knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook  # noqa: B018
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    return _CALL in source and "*bound_args.values())" in source


def can_launch_directly() -> bool:
    """The direct path is supported here and no profiler's launch hooks are set (launches must go
    through kernel[grid] for them)."""
    if not direct_launch_supported():
        return False
    runtime = triton.knobs.runtime
    return not (_active(runtime.launch_enter_hook) or _active(runtime.launch_exit_hook))


def _active(hook) -> bool:
    # A hook is None or a function in older releases; in newer ones a chain, empty by default.
    return hook is not None and bool(getattr(hook, "calls", True))


def current_device_and_stream():
    """The device and stream kernel[grid] would launch on (the current ones)."""
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    return device, driver.get_current_stream(device)


class LoadedKernel:
    """A compiled kernel, loaded onto the current device, launched with all its arguments."""

    __slots__ = ("_run", "_function", "_metadata")

    def __init__(self, compiled):
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()  # loads the binary onto the current device if it is not yet
        self._run = compiled.run
        self._function = compiled.function
        self._metadata = compiled.packed_metadata

    def launch(self, grid_x: int, grid_y: int, stream, args) -> None:
        self._run(grid_x, grid_y, 1, stream, self._function, self._metadata, None, None, None,
                  *args)


def load(jit_function, args, grid, options) -> LoadedKernel:
    """Compile (if needed) and load ``jit_function`` for ``args`` without launching it."""
    compiled = jit_function.warmup(*args, grid=grid, **options)
    return LoadedKernel(compiled)
