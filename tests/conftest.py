"""Shared test setup.

Without a GPU the Triton kernel runs under the interpreter, which must be switched on before
triton is first imported, so it is set here, ahead of every test module. The tests that run a
kernel carry the ``interpreter`` marker (pyproject.toml), so that ``-m interpreter`` selects them.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
