"""Which implementation serves a call: ``SPECOPS_BACKEND`` (docs/api.md, "Environment variables")."""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("auto", "torch", "triton")

# Read on every call (tests and users may change them between calls), so read cheaply: on POSIX,
# os.environ keeps its values as bytes in ``_data`` and decodes them on every ``get``.
_RAW_ENVIRON = getattr(os.environ, "_data", None) if os.name == "posix" else None


_DECODED: dict = {}  # name -> (the raw value object last seen, its decoded value)
_ENCODED = {name: name.encode() for name in ("SPECOPS_BACKEND", "SPECOPS_VALIDATE")}


def read_environment(name: str) -> str | None:
    """os.environ.get(name), decoding a value only when it changed."""
    if _RAW_ENVIRON is None:
        return os.environ.get(name)
    raw = _RAW_ENVIRON.get(_ENCODED.get(name) or name.encode())  # the names are ASCII
    if raw is None:
        return None
    seen = _DECODED.get(name)
    if seen is None or seen[0] is not raw:
        seen = _DECODED[name] = (raw, os.fsdecode(raw))
    return seen[1]


@functools.lru_cache(maxsize=None)
def device_type(device: torch.device) -> str:
    """``device.type``, which builds a new string on every read (about 0.3 us, per call on the
    launch path)."""
    return device.type


def selected_backend(device: torch.device) -> str:
    """'torch' or 'triton' for tensors on ``device``, honouring SPECOPS_BACKEND."""
    value = read_environment("SPECOPS_BACKEND")
    choice = "auto" if value is None else (value.strip().lower() or "auto")
    if choice not in BACKENDS:
        raise ValueError(f"SPECOPS_BACKEND must be one of {', '.join(BACKENDS)}; got {choice!r}")
    if choice == "auto":
        return "triton" if device_type(device) == "cuda" else "torch"
    return choice


def triton_unavailable_error(device: torch.device) -> RuntimeError:
    """The error for SPECOPS_BACKEND=triton where Triton has no driver for ``device``'s tensors."""
    return RuntimeError(
        f"SPECOPS_BACKEND=triton cannot run the Triton kernel on {device.type} tensors here: "
        "Triton found no GPU driver. To run the kernel on CPU tensors, set TRITON_INTERPRET=1 "
        "before triton is first imported (Triton's interpreter: slow, for tests); otherwise unset "
        "SPECOPS_BACKEND (auto) or set SPECOPS_BACKEND=torch to use the pure-torch backend."
    )


def in_inference_mode(function):
    """A CPU backend run in inference mode, which spares each of its operations autograd's
    bookkeeping, its output tensor (or tuple of them) cloned out: an inference tensor refuses
    in-place updates outside."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with torch.inference_mode():
            result = function(*args, **kwargs)
        if isinstance(result, torch.Tensor):
            return result.clone()
        return tuple(tensor.clone() for tensor in result)

    return wrapper
