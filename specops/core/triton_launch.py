"""Launching an already-loaded Triton specialisation without Triton's argument binder.

``kernel[grid](...)`` binds the arguments, derives the specialisation key from their values and
looks the compiled kernel up on every call: most of a launch's host time.  A caller that can tell
its specialisation from a few properties of its own (dtypes, alignment) keeps the compiled kernel
the first launch returned and calls its launcher directly, as ``JITFunction.run`` does after the
lookup.  That call's convention has changed across Triton releases, so the direct path is used only
where the installed ``JITFunction.run`` makes it the same way (``direct_launch_supported``);
elsewhere, and while a profiler's launch hooks are set, callers take ``kernel[grid]``.

The launcher itself is a Python wrapper (``CudaLauncher.__call__``) around a C function: it
allocates scratch memory when the kernel needs some and passes everything on. For a kernel that
needs none, ``LoadedKernel`` calls the C function itself, with what the wrapper would pass, where
the installed wrapper's call is one this module knows (``calls_c_function_directly``); elsewhere
it calls the wrapper.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import re

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


def direct_launch_target():
    """(device, stream) a direct launch goes to now (the current ones, as for kernel[grid]), or
    None where launches must go through kernel[grid]: the direct path is unsupported here, or a
    profiler's launch hooks are set."""
    if not direct_launch_supported():
        return None
    runtime = triton.knobs.runtime
    if _active(runtime.launch_enter_hook) or _active(runtime.launch_exit_hook):
        return None
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    return device, driver.get_current_stream(device)


def _active(hook) -> bool:
    # A hook is None or a function in older releases; in newer ones a chain, empty by default.
    return hook is not None and bool(getattr(hook, "calls", True))


# Hashes of CudaLauncher.__call__'s source, spaces removed, in the releases whose wrapper only
# allocates scratch memory (and adds a sanitizer's arguments when one is on) before passing the
# launch on to its C function with the kernel's arguments as one tuple. Any other wrapper (another
# release, a patched one) may do more, so it is called as it is.
_KNOWN_WRAPPERS = {
    "7689f191428df69b": "3.7",
    "07cb65bca80ed204": "3.8",
    "b3d689acc085368a": "3.9",
}


@functools.lru_cache(maxsize=8)
def calls_c_function_directly(launcher_class) -> bool:
    """Whether the installed wrapper is one whose C call ``LoadedKernel`` can make itself."""
    try:
        source = re.sub(r"\s+", "", inspect.getsource(launcher_class.__call__))
    except (AttributeError, OSError, TypeError):
        return False
    return hashlib.sha256(source.encode()).hexdigest()[:16] in _KNOWN_WRAPPERS


def _needs_wrapper(launcher) -> bool:
    """Whether the wrapper does more than pass the launch on: scratch memory to allocate, or a
    sanitizer's arguments to add."""
    return bool(getattr(launcher, "global_scratch_size", 0)
                or getattr(launcher, "profile_scratch_size", 0)
                or getattr(launcher, "gsan_enabled", False))


class LoadedKernel:
    """A compiled kernel, loaded onto the current device, launched with all its arguments:
    ``launch(grid_x, grid_y, stream, args)``."""

    __slots__ = ("launch", "_run", "_c_launch", "_function", "_metadata", "_c_prefix")

    def __init__(self, compiled):
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()  # loads the binary onto the current device if it is not yet
        self._run = compiled.run
        self._function = compiled.function
        self._metadata = compiled.packed_metadata
        self.launch = self._launch_through_wrapper
        if not _needs_wrapper(self._run) and calls_c_function_directly(type(self._run)):
            self._c_launch = self._run.launch
            self._c_prefix = (self._run.launch_cooperative_grid, self._run.launch_pdl,
                              self._metadata, None, None, None, None, None,
                              self._run.arg_annotations, self._run.kernel_signature)
            self.launch = self._launch_c_function

    def _launch_through_wrapper(self, grid_x: int, grid_y: int, stream, args) -> None:
        self._run(grid_x, grid_y, 1, stream, self._function, self._metadata, None, None, None,
                  *args)

    def _launch_c_function(self, grid_x: int, grid_y: int, stream, args) -> None:
        # The wrapper's call with no launch metadata, no hooks and no scratch memory.
        self._c_launch(grid_x, grid_y, 1, stream, self._function, *self._c_prefix, args)


def load(jit_function, args, grid, options) -> LoadedKernel:
    """Compile (if needed) and load ``jit_function`` for ``args`` without launching it."""
    compiled = jit_function.warmup(*args, grid=grid, **options)
    return LoadedKernel(compiled)
