"""Shared test setup.

Without a GPU the Triton kernel runs under the interpreter, which must be switched on before
triton is first imported, so it is set here, ahead of every test module. The tests that run a
kernel carry the ``interpreter`` marker (pyproject.toml), so that ``-m interpreter`` selects them.

The sm_90 compile checks (modules with ``COMPILE_JOBS``) start their compiling workers at
collection, one at a time in the background (tests/compile_checks.py), and run last: the compiles
take the core the rest of the suite leaves idle.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected: only the selected modules
def pytest_collection_modifyitems(session, config, items):
    if config.option.collectonly:
        return
    import compile_checks  # tests/compile_checks.py

    modules = {}
    for item in items:
        module = getattr(item, "module", None)
        if hasattr(module, "COMPILE_JOBS"):
            modules.setdefault(module.__name__, module.COMPILE_JOBS)
    for jobs in modules.values():
        for job in jobs:
            compile_checks.prefetch(*job)
    items.sort(key=lambda item: hasattr(getattr(item, "module", None), "COMPILE_JOBS"))


def pytest_sessionfinish(session, exitstatus):
    import compile_checks

    compile_checks.stop()
