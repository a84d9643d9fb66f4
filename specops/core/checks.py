"""Argument checks shared by the eager implementations and the fake (meta) implementation.

``check_arguments`` looks only at shapes, dtypes and devices, so it runs unchanged on real tensors
and on fake tensors at trace time: bad input raises the same error in eager mode and under
``torch.compile``.  ``check_values`` is the opt-in ``SPECOPS_VALIDATE=1`` mode: it reads the data
(a host synchronisation), so it is for debugging, not for CUDA-graph capture.
"""

from __future__ import annotations

import os

import torch

PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _check_dtype(name: str, t: torch.Tensor, allowed: tuple) -> None:
    if t.dtype not in allowed:
        names = " or ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} must have dtype {names}; got {str(t.dtype).replace('torch.', '')}")


def _check_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(
            f"{name} must be on the same device as target_probs ({device}); got {t.device}"
        )


def check_arguments(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
) -> None:
    """Raise ValueError (shapes, devices) or TypeError (dtypes) naming the offending argument."""
    if target_probs.dim() != 3:
        raise ValueError(
            "target_probs must have shape (batch_size, num_speculate_tokens + 1, vocab_size); "
            f"got {target_probs.dim()}-D shape {_shape(target_probs)}"
        )
    _check_dtype("target_probs", target_probs, PROB_DTYPES)
    batch, n_plus_one, vocab = target_probs.shape
    device = target_probs.device
    if n_plus_one < 2:
        raise ValueError(
            "target_probs must have num_speculate_tokens + 1 >= 2 positions; "
            f"got shape {_shape(target_probs)}"
        )
    if vocab < 1:
        raise ValueError(f"target_probs must have vocab_size >= 1; got shape {_shape(target_probs)}")
    num_draft = n_plus_one - 1

    expected_ids = (batch, num_draft)
    if draft_token_ids.dim() != 2 or _shape(draft_token_ids) != expected_ids:
        raise ValueError(
            f"draft_token_ids must have shape (batch_size, num_speculate_tokens) = {expected_ids} "
            f"to match target_probs {_shape(target_probs)}; got {_shape(draft_token_ids)}"
        )
    _check_dtype("draft_token_ids", draft_token_ids, INDEX_DTYPES)
    _check_device("draft_token_ids", draft_token_ids, device)

    if draft_probs is not None:
        expected = (batch, num_draft, vocab)
        if draft_probs.dim() != 3 or _shape(draft_probs) != expected:
            raise ValueError(
                "draft_probs must have shape (batch_size, num_speculate_tokens, vocab_size) = "
                f"{expected} to match target_probs {_shape(target_probs)}; got {_shape(draft_probs)}"
            )
        if draft_probs.dtype != target_probs.dtype:
            raise TypeError(
                f"draft_probs must have the dtype of target_probs ({target_probs.dtype}); "
                f"got {draft_probs.dtype}"
            )
        _check_device("draft_probs", draft_probs, device)

    for name, counter in (("accepted_num", accepted_num), ("emitted_num", emitted_num)):
        if counter.dim() != 1 or counter.shape[0] != batch:
            raise ValueError(
                f"{name} must have shape (batch_size,) = ({batch},); got {_shape(counter)}"
            )
        _check_dtype(name, counter, INDEX_DTYPES)
        _check_device(name, counter, device)

    for name, t in (("seed", seed), ("offset", offset)):
        if t.dim() != 1 or (t.shape[0] != 1 and t.shape[0] != batch):
            raise ValueError(
                f"{name} must be a 1-D tensor of 1 or batch_size ({batch}) elements; "
                f"got shape {_shape(t)}"
            )
        _check_dtype(name, t, (torch.int64,))
        _check_device(name, t, device)


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
) -> None:
    """SPECOPS_VALIDATE=1: reject data that the op would otherwise tolerate silently.

    Ids must be -1 (padding) or in [0, vocab_size); probabilities must be finite and >= 0.
    """
    vocab = target_probs.shape[-1]
    where = _first_bad_index((draft_token_ids < -1) | (draft_token_ids >= vocab))
    if where is not None:
        value = int(draft_token_ids[where])
        raise ValueError(
            f"draft_token_ids must be -1 (padding) or in [0, {vocab}); "
            f"got {value} at index {where} (SPECOPS_VALIDATE=1)"
        )
    for name, probs in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if probs is None:
            continue
        where = _first_bad_index(~torch.isfinite(probs) | (probs < 0))
        if where is not None:
            raise ValueError(
                f"{name} must be finite and >= 0; got {float(probs[where])} at index {where} "
                "(SPECOPS_VALIDATE=1)"
            )
