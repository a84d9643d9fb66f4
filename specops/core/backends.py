"""Which implementation serves a call: ``SPECOPS_BACKEND`` (docs/api.md, "Environment variables")."""

from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "torch", "triton")


def selected_backend(device: torch.device) -> str:
    """'torch' or 'triton' for tensors on ``device``, honouring SPECOPS_BACKEND."""
    choice = os.environ.get("SPECOPS_BACKEND", "auto").strip().lower() or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"SPECOPS_BACKEND must be one of {', '.join(BACKENDS)}; got {choice!r}")
    if choice == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return choice


def triton_unavailable_error(device: torch.device) -> RuntimeError:
    """The error for SPECOPS_BACKEND=triton where Triton has no driver for ``device``'s tensors."""
    return RuntimeError(
        f"SPECOPS_BACKEND=triton cannot run the Triton kernel on {device.type} tensors here: "
        "Triton found no GPU driver. To run the kernel on CPU tensors, set TRITON_INTERPRET=1 "
        "before triton is first imported (Triton's interpreter: slow, for tests); otherwise unset "
        "SPECOPS_BACKEND (auto) or set SPECOPS_BACKEND=torch to use the pure-torch backend."
    )
