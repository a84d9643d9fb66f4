"""Shared test setup.

Without a GPU the Triton kernel runs under the interpreter, which must be switched on before
triton is first imported, so it is set here, ahead of every test module.

Triton's interpreter before 3.3 cannot run the kernels (it lacks a boolean ``~``, a loop bounded by
a program id, and a constexpr ``tl.arange`` bound in a called function): there the tests that run
them interpreted are skipped, saying so. Compiled, the kernels build on those releases too (the
stand-in driver tests compile them for sm_90).
"""

import os
from importlib import metadata

import pytest
import torch

INTERPRETED = not torch.cuda.is_available()
if INTERPRETED:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests that run a Triton kernel under the interpreter: whole files, or file::test.
RUN_KERNELS_INTERPRETED = (
    "test_triton_kernel.py",
    "test_block_kernel.py",
    "test_docs.py::test_contributing_interpreter_demo_command_passes",
    "test_host_path.py::test_zero_tensor_input_reaches_its_own_key",
    "test_benchmarks.py::test_gpu_check_rehearsal",  # its grid and agreement steps
)


def _triton_version() -> tuple[int, int] | None:
    try:
        major, minor = metadata.version("triton").split(".")[:2]
    except metadata.PackageNotFoundError:
        return None
    return int(major), int(minor)


def interpreter_cannot_run_kernels() -> bool:
    version = _triton_version()
    return INTERPRETED and version is not None and version < (3, 3)


def pytest_collection_modifyitems(config, items):
    if not interpreter_cannot_run_kernels():
        return
    skip = pytest.mark.skip(reason="Triton < 3.3: its interpreter cannot run the kernels "
                                   "(tests/conftest.py says what it lacks)")
    for item in items:
        path = os.path.basename(str(item.path))
        if {path, f"{path}::{item.originalname}"} & set(RUN_KERNELS_INTERPRETED):
            item.add_marker(skip)
