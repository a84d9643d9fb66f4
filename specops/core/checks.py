"""Argument checks shared by the eager implementations and the fake (meta) implementation.

``check_arguments`` looks only at shapes, dtypes, devices, strides and storage aliasing, so it runs
unchanged on real tensors and on fake tensors at trace time: bad input raises the same error in
eager mode and under ``torch.compile``. It runs on every call, so the happy path is a straight run
of cheap comparisons: messages (and shape tuples) are built only when raising. ``check_values``
is the opt-in ``SPECOPS_VALIDATE=1`` mode (docs/api.md, "Environment variables").
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


class ArgumentNames(NamedTuple):
    """The names a caller gave the checked tensors, so that errors name what the caller passed."""

    draft_probs: str = "draft_probs"
    draft_token_ids: str = "draft_token_ids"
    target_probs: str = "target_probs"
    accepted_num: str = "accepted_num"
    emitted_num: str = "emitted_num"
    seed: str = "seed"
    offset: str = "offset"


# The registered ops' argument names (the schema's).
OP_NAMES = ArgumentNames()


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _require_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor; got {type(t).__name__}")


def _dtype_error(name: str, t: torch.Tensor, allowed: tuple) -> TypeError:
    names = " or ".join(_dtype_name(d) for d in allowed)
    return TypeError(f"{name} must have dtype {names}; got {_dtype_name(t.dtype)}")


def _device_error(name: str, t: torch.Tensor, device: torch.device) -> ValueError:
    return ValueError(f"{name} must be on the same device as target_probs ({device}); got {t.device}")


def _byte_spans(t: torch.Tensor) -> set:
    """The bytes of its storage a 1-D tensor covers (only called when two tensors share one)."""
    size = t.element_size()
    start, stride = int(t.storage_offset()) * size, int(t.stride(0)) * size
    return {start + k * stride + b for k in range(int(t.shape[0])) for b in range(size)}


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether 1-D tensors ``a`` and ``b`` share a byte of memory."""
    if not torch._C._is_alias_of(a, b):  # different storages: cheap, and the usual answer
        return False
    return not _byte_spans(a).isdisjoint(_byte_spans(b))


def _check_counter(name: str, counter, batch, device) -> None:
    _require_tensor(name, counter)
    if counter.dim() != 1 or counter.shape[0] != batch:
        raise ValueError(f"{name} must have shape (batch_size,) = ({batch},); got {_shape(counter)}")
    if counter.dtype not in INDEX_DTYPES:
        raise _dtype_error(name, counter, INDEX_DTYPES)
    if counter.device != device:
        raise _device_error(name, counter, device)
    if counter.stride(0) == 0 and batch > 1:
        raise ValueError(
            f"{name} must have one element per request; got a tensor whose {batch} elements share "
            "one memory location (stride 0, e.g. from expand): pass a tensor of its own, such as "
            "torch.zeros(batch_size, dtype=torch.int32)"
        )


def _check_seed_like(name: str, t, batch, device) -> None:
    _require_tensor(name, t)
    if t.dim() != 1 or (t.shape[0] != 1 and t.shape[0] != batch):
        raise ValueError(
            f"{name} must be a 1-D tensor of 1 or batch_size ({batch}) elements; "
            f"got shape {_shape(t)}"
        )
    if t.dtype != torch.int64:
        raise _dtype_error(name, t, (torch.int64,))
    if t.device != device:
        raise _device_error(name, t, device)


def check_arguments(
    *,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    names: ArgumentNames = OP_NAMES,
) -> None:
    """Raise ValueError (shapes, devices, aliasing) or TypeError (types, dtypes) naming the
    offending argument as the caller called it (``names``)."""
    _require_tensor(names.target_probs, target_probs)
    if target_probs.dim() != 3:
        raise ValueError(
            f"{names.target_probs} must have shape (batch_size, num_speculate_tokens + 1, "
            f"vocab_size); got {target_probs.dim()}-D shape {_shape(target_probs)}"
        )
    if target_probs.dtype not in PROB_DTYPES:
        raise _dtype_error(names.target_probs, target_probs, PROB_DTYPES)
    batch, n_plus_one, vocab = target_probs.shape
    device = target_probs.device
    if n_plus_one < 2:
        raise ValueError(
            f"{names.target_probs} must have num_speculate_tokens + 1 >= 2 positions; "
            f"got shape {_shape(target_probs)}"
        )
    if vocab < 1:
        raise ValueError(
            f"{names.target_probs} must have vocab_size >= 1; got shape {_shape(target_probs)}")
    num_draft = n_plus_one - 1

    _require_tensor(names.draft_token_ids, draft_token_ids)
    if draft_token_ids.dim() != 2 or draft_token_ids.shape[0] != batch \
            or draft_token_ids.shape[1] != num_draft:
        raise _ids_shape_error(names, draft_token_ids, target_probs)
    if draft_token_ids.dtype not in INDEX_DTYPES:
        raise _dtype_error(names.draft_token_ids, draft_token_ids, INDEX_DTYPES)
    if draft_token_ids.device != device:
        raise _device_error(names.draft_token_ids, draft_token_ids, device)

    if draft_probs is not None:
        _require_tensor(names.draft_probs, draft_probs)
        if draft_probs.dim() != 3 or draft_probs.shape[0] != batch \
                or draft_probs.shape[1] != num_draft or draft_probs.shape[2] != vocab:
            raise ValueError(
                f"{names.draft_probs} must have shape (batch_size, num_speculate_tokens, "
                f"vocab_size) = {(batch, num_draft, vocab)} to match {names.target_probs} "
                f"{_shape(target_probs)}; got {_shape(draft_probs)}"
            )
        if draft_probs.dtype != target_probs.dtype:
            raise TypeError(
                f"{names.draft_probs} must have the dtype of {names.target_probs} "
                f"({_dtype_name(target_probs.dtype)}); got {_dtype_name(draft_probs.dtype)}"
            )
        if draft_probs.device != device:
            raise _device_error(names.draft_probs, draft_probs, device)

    _check_counter(names.accepted_num, accepted_num, batch, device)
    _check_counter(names.emitted_num, emitted_num, batch, device)
    _check_seed_like(names.seed, seed, batch, device)
    _check_seed_like(names.offset, offset, batch, device)


def check_counters_apart(
    *,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    draft_token_ids: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    names: ArgumentNames = OP_NAMES,
) -> None:
    """Raise ValueError when a counter shares memory with the other counter, the ids, the seed or
    the offset: the kernels write the counters while reading those, so the result would depend on
    the order the hardware runs the requests in. Call it after ``check_arguments``.

    Separate from ``check_arguments`` because Dynamo cannot trace the storage comparison: the
    fake implementation runs it at trace time, on fake tensors that keep the inputs' aliasing.
    """
    if accepted_num.shape[0] == 0:
        return
    if _overlaps(accepted_num, emitted_num):
        raise ValueError(
            f"{names.accepted_num} and {names.emitted_num} must not share memory: the op adds to "
            "both in place; pass two separate tensors"
        )
    for counter_name, counter in ((names.accepted_num, accepted_num),
                                  (names.emitted_num, emitted_num)):
        for name, t in ((names.seed, seed), (names.offset, offset)):
            if _overlaps(counter, t):
                raise ValueError(
                    f"{counter_name} must not share memory with {name}: the op writes the "
                    "counter while it reads the other; pass separate tensors"
                )
        if torch._C._is_alias_of(counter, draft_token_ids):
            raise ValueError(
                f"{counter_name} must not share memory with {names.draft_token_ids}: the op "
                "writes the counter while it reads the ids; pass separate tensors"
            )


def _ids_shape_error(names: ArgumentNames, ids: torch.Tensor, target: torch.Tensor) -> ValueError:
    """Say which argument's shape implies what, blaming neither when both are well-formed."""
    batch, n_plus_one, _ = target.shape
    expected = (batch, n_plus_one - 1)
    if ids.dim() == 2 and ids.shape[0] == batch:
        # Both well-formed, numbers of positions disagree: either may be the wrong one.
        return ValueError(
            f"{names.draft_token_ids} and {names.target_probs} disagree on the number of draft "
            f"tokens: {names.draft_token_ids} of shape {_shape(ids)} has {ids.shape[1]} per "
            f"request, so {names.target_probs} needs {ids.shape[1]} + 1 = {ids.shape[1] + 1} "
            f"positions, shape ({batch}, {ids.shape[1] + 1}, vocab_size); {names.target_probs} of "
            f"shape {_shape(target)} has {n_plus_one} positions, which implies "
            f"{names.draft_token_ids} of shape (batch_size, num_speculate_tokens) = {expected}"
        )
    return ValueError(
        f"{names.draft_token_ids} must have shape (batch_size, num_speculate_tokens) = {expected} "
        f"to match {names.target_probs} {_shape(target)}; got {_shape(ids)}"
    )


def validation_enabled() -> bool:
    return os.environ.get("SPECOPS_VALIDATE", "0") not in ("", "0")


def _first_bad_index(bad: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first True element of ``bad``, or None when there is none."""
    if not bool(bad.any()):
        return None
    return tuple(int(i) for i in bad.nonzero()[0])


def check_values(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    names: ArgumentNames = OP_NAMES,
) -> None:
    """SPECOPS_VALIDATE=1: reject data that the op would otherwise tolerate silently.

    Ids must be -1 (padding) or in [0, vocab_size); probabilities must be finite and >= 0.
    """
    vocab = target_probs.shape[-1]
    where = _first_bad_index((draft_token_ids < -1) | (draft_token_ids >= vocab))
    if where is not None:
        value = int(draft_token_ids[where])
        raise ValueError(
            f"{names.draft_token_ids} must be -1 (padding) or in [0, {vocab}); "
            f"got {value} at index {where} (SPECOPS_VALIDATE=1)"
        )
    for name, probs in ((names.target_probs, target_probs), (names.draft_probs, draft_probs)):
        if probs is None:
            continue
        where = _first_bad_index(~torch.isfinite(probs) | (probs < 0))
        if where is not None:
            raise ValueError(
                f"{name} must be finite and >= 0; got {float(probs[where])} at index {where} "
                "(SPECOPS_VALIDATE=1)"
            )
