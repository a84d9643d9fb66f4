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
