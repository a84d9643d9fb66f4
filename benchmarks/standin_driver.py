"""A stand-in CUDA driver: Triton's real launch path on a machine without a GPU.

Installed as Triton's active driver, it lets ``kernel[grid](...)`` run everything a GPU launch runs
on the host (the argument binder, specialisation, the kernel-cache lookup, an sm_90 compilation on
a cache miss, Triton's own CUDA launcher object) up to the final C launch, which it replaces by a
call that does the C launcher's Python-facing work (the launch hooks, ``data_ptr()`` of every
argument the kernel's signature makes a pointer) and launches nothing.
Host time measured through it is the host time of a GPU launch, less the driver's C call.

Releases whose CUDA launcher is a C module built per signature against libcuda (3.2 and 3.6 among
them; 3.8 and 3.9 have the Python launcher) cannot build it without a GPU: there the stand-in
replaces that whole launcher by a Python one (``StandinLauncher``), and host times measured
through it are not those of a GPU launch, while loads and launches are counted the same.

CPU tensors stand in for CUDA tensors: with ``SPECOPS_BACKEND=triton`` specops routes them to its
Triton launcher. ``TRITON_INTERPRET`` must be unset before triton is imported (under the
interpreter ``@triton.jit`` builds interpreter objects, not compilable kernels).

    import standin_driver
    driver = standin_driver.install()      # before the first launch
    ...
    driver.utils.modules_loaded            # binaries loaded so far (one per new specialisation)
    driver.utils.launches                  # launches so far
    driver.utils.grids                     # the grid of every launch, in order

The tensors' contents are never computed: outputs are whatever ``torch.empty`` left there.
"""

from __future__ import annotations

import inspect
import os

import torch

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    raise RuntimeError("standin_driver needs TRITON_INTERPRET unset: it drives compiled kernels")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.driver import GPUDriver  # noqa: E402
from triton.backends.nvidia import driver as nvidia_driver  # noqa: E402
from triton.compiler.compiler import CompiledKernel  # noqa: E402

# Triton's own launcher is a Python object ending in the C call ``utils.launch`` where the driver
# module defines PyKernelArg; before that, a C module per signature that links libcuda.
PYTHON_LAUNCHER = hasattr(nvidia_driver, "PyKernelArg")
# Newer releases also take the most threads per block from load_binary.
LOAD_BINARY_GIVES_MAX_THREADS = "n_max_threads" in inspect.getsource(CompiledKernel._init_handles)

# Hopper: H100/H200 figures the launch path reads (shared memory limit, threads per block); the
# SM count can be changed through STANDIN_SMS, to see launch plans follow the device.
CAPABILITY = (9, 0)
SMS = int(os.environ.get("STANDIN_SMS", "132"))
PROPERTIES = {"max_shared_mem": 232448, "max_num_regs": 65536, "multiprocessor_count": SMS,
              "warpSize": 32, "sm_clock_rate": 1980000, "mem_clock_rate": 2619000,
              "mem_bus_width": 5120}
MAX_THREADS = 1024


class KernelArg:
    """Python twin of the C launcher's argument annotation (built from driver.c on a CUDA host)."""

    __slots__ = ("nested_tuple", "type")

    def __init__(self, nested_tuple, type):
        self.nested_tuple = nested_tuple
        self.type = type


class StandinUtils:
    """What Triton calls through ``driver.active.utils``, counted; no CUDA call is made."""

    def __init__(self):
        self.modules_loaded = 0
        self.launches = 0
        self.grids = []  # (x, y, z) of every launch, in order
        self._pointers = {}

    def load_binary(self, name, kernel, shared, device):
        self.modules_loaded += 1
        # (module, function, registers, spills[, most threads per block]); the registers are the
        # cubin's, as the driver reports them
        loaded = (self.modules_loaded, self.modules_loaded, cubin_registers(kernel), 0)
        return (*loaded, MAX_THREADS) if LOAD_BINARY_GIVES_MAX_THREADS else loaded

    def unload_module(self, module):
        pass

    def get_device_properties(self, device):
        return dict(PROPERTIES)

    def is_stream_capturing(self, stream):
        return False

    def build_signature_metadata(self, kernel_signature):
        return tuple(kernel_signature)

    def launch(self, grid_x, grid_y, grid_z, stream, function, cooperative, pdl, kernel_metadata,
               launch_metadata, enter_hook, exit_hook, global_scratch, profile_scratch,
               arg_annotations, kernel_signature, kernel_args):
        # Which arguments are pointers is worked out once per launcher (the C launcher reads each
        # argument's kind from the signature's bytes, in C): its annotations, made with its
        # signature, name it.
        known = self._pointers.get(id(arg_annotations))
        if known is None:  # kept with its annotations, so that their id is not reused
            known = self._pointers[id(arg_annotations)] = (
                arg_annotations, pointer_positions(arg_annotations, kernel_signature))
        self.record_launch((grid_x, grid_y, grid_z), kernel_args, known[1], launch_metadata,
                           enter_hook, exit_hook)

    def record_launch(self, grid, kernel_args, pointers, launch_metadata, enter_hook, exit_hook):
        """The C launcher's Python-facing work: the hooks around the launch, when given, and the
        address of every pointer argument (None or an int is taken as it is)."""
        self.grids.append(grid)
        if enter_hook is not None:
            enter_hook(launch_metadata)
        for i in pointers:
            pointer = kernel_args[i]
            if pointer is not None and type(pointer) is not int:
                pointer.data_ptr()
        self.launches += 1
        if exit_hook is not None:
            exit_hook(launch_metadata)


def cubin_registers(cubin: bytes) -> int:
    """Registers per thread of a compiled kernel, read from its cubin (cuobjdump, beside Triton)."""
    from sass_budget import resources  # benchmarks/, beside this file

    return resources(cubin)["REG"]


def pointer_positions(arg_annotations, kernel_signature) -> tuple[int, ...]:
    """Positions in a launch's arguments of the tensors its signature passes as pointers
    (constexpr arguments are in the arguments, not in the signature)."""
    kernel_types = iter(kernel_signature)
    positions = []
    for position, annotation in enumerate(arg_annotations):
        if annotation.type != nvidia_driver.ARG_CONSTEXPR and next(kernel_types).startswith("*"):
            positions.append(position)
    return tuple(positions)


class StandinLauncher:
    """Triton's CUDA launcher where its C function is built per signature (it links libcuda),
    shaped as that launcher is: ``launch`` in the C function's place calls the enter and exit
    hooks, reads the argument addresses and counts; it launches nothing."""

    def __init__(self, src, metadata):
        self.launch = self.c_launch

    def __call__(self, *args):
        self.launch(*args)

    @staticmethod
    def c_launch(grid_x, grid_y, grid_z, stream, function, kernel_metadata, launch_metadata,
                 enter_hook, exit_hook, *kernel_args):
        tensors = [i for i, arg in enumerate(kernel_args) if isinstance(arg, torch.Tensor)]
        triton.runtime.driver.active.utils.record_launch((grid_x, grid_y, grid_z), kernel_args,
                                                         tensors, launch_metadata, enter_hook,
                                                         exit_hook)


class StandinDriver(GPUDriver):
    """Triton's CUDA driver with the CUDA calls answered on the host: device 0, stream 0, sm_90."""

    launcher_cls = nvidia_driver.CudaLauncher if PYTHON_LAUNCHER else StandinLauncher

    def __init__(self):
        self.utils = StandinUtils()

    @staticmethod
    def is_active():
        return True

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_device_capability(self, device=None):
        return CAPABILITY

    def get_current_target(self):
        return GPUTarget("cuda", CAPABILITY[0] * 10 + CAPABILITY[1], 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda

    def map_python_to_cpp_type(self, ty):
        return nvidia_driver.ty_to_cpp(ty)

    def get_benchmarker(self):
        raise RuntimeError("the stand-in driver launches nothing, so it cannot benchmark kernels")


def install() -> StandinDriver:
    """Make a new stand-in driver Triton's active driver and return it."""
    # Triton's CUDA launcher annotates arguments with classes its C module defines on a CUDA host.
    if PYTHON_LAUNCHER and nvidia_driver.PyKernelArg is None:
        nvidia_driver.PyKernelArg = KernelArg
        nvidia_driver.ARG_CONSTEXPR, nvidia_driver.ARG_KERNEL, nvidia_driver.ARG_TUPLE = 0, 1, 2
    driver = StandinDriver()
    triton.runtime.driver.set_active(driver)
    return driver
