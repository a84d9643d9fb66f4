"""A stand-in CUDA driver: Triton's launch path on a machine without a GPU.

Installed as Triton's active driver (``triton.runtime.driver.set_active``), a ``GPUDriver``
(``triton.backends.driver``) that answers the driver interface on the host: device 0, stream 0,
an sm_90 target, Hopper's device properties, and a ``utils.load_binary`` that counts the binaries
it loads and reports each one's registers (read from its cubin with cuobjdump). So
``kernel[grid](...)`` runs on CPU tensors what it runs for a GPU launch: the argument binder,
specialisation, the kernel-cache lookup, an sm_90 compilation on a cache miss, the loading, the
launch metadata and the launch hooks, up to the call of the driver's launcher object
(``launcher_cls``). The stand-in's launcher calls the hooks, reads every tensor argument's
``data_ptr()``, records the grid and launches nothing.

Host time measured through it is Triton's host path of a launch less the backend's own launcher
(Triton's CUDA launcher: its argument packing and the driver's launch call), which the stand-in's
small launcher replaces.

CPU tensors stand in for CUDA tensors: with ``SPECOPS_BACKEND=triton`` specops routes them to its
Triton launchers. ``TRITON_INTERPRET`` must be unset before triton is imported (under the
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

import os

import torch

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    raise RuntimeError("standin_driver needs TRITON_INTERPRET unset: it drives compiled kernels")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.driver import GPUDriver  # noqa: E402

# Hopper: H100/H200 figures the launch path reads (shared memory limit, threads per block); the
# SM count can be changed through STANDIN_SMS, to see launch plans follow the device.
CAPABILITY = (9, 0)
SMS = int(os.environ.get("STANDIN_SMS", "132"))
PROPERTIES = {"max_shared_mem": 232448, "max_num_regs": 65536, "multiprocessor_count": SMS,
              "warpSize": 32, "sm_clock_rate": 1980000, "mem_clock_rate": 2619000,
              "mem_bus_width": 5120}
MAX_THREADS = 1024
# What load_binary returns gained the most threads per block in Triton 3.4.
GIVES_MAX_THREADS = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 4)


class StandinUtils:
    """What Triton calls through ``driver.active.utils``, counted; no CUDA call is made."""

    def __init__(self):
        self.modules_loaded = 0
        self.launches = 0
        self.grids = []  # (x, y, z) of every launch, in order

    def load_binary(self, name, kernel, shared, device):
        """(module, function, registers, spills[, most threads per block]) of a loaded binary;
        the registers are the cubin's, as the CUDA driver reports them."""
        self.modules_loaded += 1
        loaded = (self.modules_loaded, self.modules_loaded, cubin_registers(kernel), 0)
        return (*loaded, MAX_THREADS) if GIVES_MAX_THREADS else loaded

    def unload_module(self, module):
        pass

    def get_device_properties(self, device):
        return dict(PROPERTIES)


def cubin_registers(cubin: bytes) -> int:
    """Registers per thread of a compiled kernel, read from its cubin (cuobjdump, beside Triton)."""
    from sass import resources  # tests/sass.py, beside this file

    return resources(cubin)["REG"]


class StandinLauncher:
    """The driver's launcher of one compiled kernel (``launcher_cls(src, metadata)``), called with
    the grid, the stream, the loaded function, the packed metadata, the launch metadata, the enter
    and exit hooks and then the kernel's arguments: the hooks around the launch, when given, and
    the address of every tensor argument; it launches nothing."""

    def __init__(self, src, metadata):
        pass

    def __call__(self, grid_x, grid_y, grid_z, stream, function, packed_metadata,
                 launch_metadata, enter_hook, exit_hook, *kernel_args):
        utils = triton.runtime.driver.active.utils
        utils.grids.append((grid_x, grid_y, grid_z))
        if enter_hook is not None:
            enter_hook(launch_metadata)
        for arg in kernel_args:
            if isinstance(arg, torch.Tensor):
                arg.data_ptr()
        utils.launches += 1
        if exit_hook is not None:
            exit_hook(launch_metadata)


class StandinDriver(GPUDriver):
    """Triton's GPU driver interface answered on the host: device 0, stream 0, sm_90."""

    launcher_cls = StandinLauncher

    def __init__(self):  # GPUDriver's would bind torch.cuda's device and stream functions
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
        raise NotImplementedError("the stand-in driver builds no C launcher")

    def get_benchmarker(self):
        raise RuntimeError("the stand-in driver launches nothing, so it cannot benchmark kernels")


def install() -> StandinDriver:
    """Make a new stand-in driver Triton's active driver and return it."""
    driver = StandinDriver()
    triton.runtime.driver.set_active(driver)
    return driver
