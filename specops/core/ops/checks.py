"""Pieces every sampler's argument checks are built from: errors that name the argument as the
caller passed it, the memory-overlap test for tensors an op writes, and the opt-in value checks'
switch (``SPECOPS_VALIDATE``, docs/api.md "Environment variables").

The checks look only at shapes, dtypes, devices and strides, so they run unchanged on real tensors
and on fake tensors at trace time: bad input raises the same error in eager mode and under
``torch.compile``.
"""

from __future__ import annotations

import torch

from .backends import read_environment


def shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def require_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor; got {type(t).__name__}")


def dtype_error(name: str, t: torch.Tensor, allowed: tuple) -> TypeError:
    names = " or ".join(dtype_name(d) for d in allowed)
    return TypeError(f"{name} must have dtype {names}; got {dtype_name(t.dtype)}")


def device_error(name: str, t: torch.Tensor, device: torch.device, reference: str) -> ValueError:
    return ValueError(f"{name} must be on the same device as {reference} ({device}); got {t.device}")


def _progression(t: torch.Tensor) -> tuple[int, int, int, int]:
    """A 1-D tensor's elements in its storage, in bytes: (first, step, count, width)."""
    width = t.element_size()
    return int(t.storage_offset()) * width, int(t.stride(0)) * width, int(t.shape[0]), width


def _hits(point: int, width: int, first: int, step: int, count: int, other_width: int) -> bool:
    """Whether bytes [point, point + width) meet one of ``count`` elements of ``other_width``
    bytes at first, first + step, ... (step > 0)."""
    # Element j meets it when first + j * step lies in (point - other_width, point + width).
    low = (point - other_width - first) // step + 1  # smallest j past the lower end
    return max(low, 0) <= min(count - 1, (point + width - 1 - first) // step)


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether 1-D tensors ``a`` and ``b`` (of nonzero strides, or one element) share a byte."""
    if not torch._C._is_alias_of(a, b):  # different storages: cheap, and the usual answer
        return False
    a0, sa, na, wa = _progression(a)
    b0, sb, nb, wb = _progression(b)
    if na == 0 or nb == 0:
        return False
    if a0 + (na - 1) * sa + wa <= b0 or b0 + (nb - 1) * sb + wb <= a0:
        return False  # disjoint spans, the layout of slices of one buffer
    if na == 1 or sa == 0:
        return nb == 1 or sb == 0 or _hits(a0, wa, b0, sb, nb, wb)
    if nb == 1 or sb == 0:
        return _hits(b0, wb, a0, sa, na, wa)
    # Interleaved progressions (columns of one (B, k) buffer, say): element by element.
    return any(_hits(a0 + i * sa, wa, b0, sb, nb, wb) for i in range(na))


# SPECOPS_VALIDATE's spellings; anything else is refused, so that a typo never silently decides.
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def validating_eagerly() -> bool:
    """``validation_enabled`` in eager code: a value check outside an op reads the data on the
    host, which a trace cannot (the ops' own checks run inside them, traced or not)."""
    return not torch.compiler.is_compiling() and validation_enabled()


def validation_enabled() -> bool:
    """Whether SPECOPS_VALIDATE asks for the value checks (read at every call)."""
    value = read_environment("SPECOPS_VALIDATE")
    if value is None:
        return False
    value = value.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(
        f"SPECOPS_VALIDATE must be one of 1, true, yes, on (validate) or 0, false, no, off, empty "
        f"(do not); got {value!r}")


def first_bad_index(bad: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first True element of ``bad``, or None when there is none."""
    if not bool(bad.any()):
        return None
    return tuple(int(i) for i in bad.nonzero()[0])


# How far a probability row's mass may lie from 1 under SPECOPS_VALIDATE=1: a softmax rounded to
# bfloat16 is off by at most 2**-8 of it (float16, float32: less); a row scaled, or a softmax over
# another dimension, is off by far more.
MASS_TOLERANCE = 0.01


def check_row_masses(name: str, probs: torch.Tensor, read: torch.Tensor) -> None:
    """SPECOPS_VALIDATE=1: the rows (..., V) of ``probs`` the op reads (``read``, bool (...)) sum
    to 1 within MASS_TOLERANCE, or hold no mass (a rule of its own); the rules' guarantee is for
    probability rows. Sanitised values (NaN, negative, ...) are refused before this."""
    check_masses(name, probs.double().sum(dim=-1), read)


def check_masses(name: str, mass: torch.Tensor, read: torch.Tensor) -> None:
    """``check_row_masses`` of rows whose float64 masses (...) are given (a vocabulary shard's
    rows: their masses summed over the ranks)."""
    where = first_bad_index(read & (mass != 0) & ((mass - 1).abs() > MASS_TOLERANCE))
    if where is not None:
        raise ValueError(
            f"{name} must hold probability rows, each summing to 1 (within {MASS_TOLERANCE}) or "
            f"to 0; the row at index {where} sums to {float(mass[where]):.6g} (a scaled row, or a "
            f"softmax over another dimension?) (SPECOPS_VALIDATE=1)")
