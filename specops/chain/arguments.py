"""The arguments every verifier of a chain of drafts takes, checked (token and block verification
share them): the same checks in the eager implementations and the fake one, so bad input raises the
same error in eager mode and under ``torch.compile``.

``check_arguments`` runs on every call, so the happy path is a straight run of cheap comparisons:
messages (and shape tuples) are built only when raising. ``check_values`` is the opt-in
``SPECOPS_VALIDATE=1`` mode (docs/api.md, "Environment variables").
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.ops.checks import (check_row_masses, device_error, dtype_error, dtype_name,
                               first_bad_index, overlaps, require_tensor, shape)
from ..core.sampling.probs import PROBABILITY_BOUND

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


def _check_counter(name: str, counter, batch, device, reference: str,
                   optional: bool = False) -> None:
    if counter is None and optional:  # the ops from logits return their counts instead
        return
    require_tensor(name, counter)
    if counter.dim() != 1 or counter.shape[0] != batch:
        raise ValueError(f"{name} must have shape (batch_size,) = ({batch},); got {shape(counter)}")
    if counter.dtype not in INDEX_DTYPES:
        raise dtype_error(name, counter, INDEX_DTYPES)
    if counter.device != device:
        raise device_error(name, counter, device, reference)
    if counter.stride(0) == 0 and batch > 1:
        raise ValueError(
            f"{name} must have one element per request; got a tensor whose {batch} elements share "
            "one memory location (stride 0, e.g. from expand): pass a tensor of its own, such as "
            "torch.zeros(batch_size, dtype=torch.int32)"
        )


def _check_seed_like(name: str, t, batch, device, reference: str) -> None:
    require_tensor(name, t)
    if t.dim() != 1 or (t.shape[0] != 1 and t.shape[0] != batch):
        raise ValueError(
            f"{name} must be a 1-D tensor of 1 or batch_size ({batch}) elements; "
            f"got shape {shape(t)}"
        )
    if t.dtype != torch.int64:
        raise dtype_error(name, t, (torch.int64,))
    if t.device != device:
        raise device_error(name, t, device, reference)


def check_arguments(
    *,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor | None,
    emitted_num: torch.Tensor | None,
    seed: torch.Tensor,
    offset: torch.Tensor,
    names: ArgumentNames = OP_NAMES,
    counters_optional: bool = False,
) -> None:
    """Raise ValueError (shapes, devices, stride 0) or TypeError (types, dtypes) naming the
    offending argument as the caller called it (``names``). ``counters_optional``: a counter may
    be None (the ops from logits take none and return their counts).

    One pass of cheap comparisons decides that all is well; only when it fails does the slow path
    look for the first problem and build its message (same checks, in order).
    """
    # Types and the target's rank first: Dynamo hands no exception raised in this pass to an
    # except clause, so nothing here may raise one.
    ok = (all(isinstance(t, torch.Tensor) for t in (draft_token_ids, target_probs, seed, offset))
          and all(t is None or isinstance(t, torch.Tensor)
                  for t in (draft_probs, accepted_num, emitted_num))
          and target_probs.dim() == 3)
    if ok:
        shape = target_probs.shape
        device = target_probs.device
        batch = shape[0]
        counters_ok = all(
            (counter is None and counters_optional)
            or (counter is not None and counter.shape == (batch,)
                and counter.dtype in INDEX_DTYPES and counter.device == device
                and (counter.is_contiguous() or counter.stride(0) != 0))
            for counter in (accepted_num, emitted_num))
        ok = (shape[1] >= 1 and shape[2] >= 1
              and target_probs.dtype in PROB_DTYPES
              and draft_token_ids.shape == (batch, shape[1] - 1)
              and draft_token_ids.dtype in INDEX_DTYPES and draft_token_ids.device == device
              and (draft_probs is None
                   or (draft_probs.shape == (batch, shape[1] - 1, shape[2])
                       and draft_probs.dtype == target_probs.dtype
                       and draft_probs.device == device))
              and counters_ok
              and seed.dim() == 1 and (seed.shape[0] == 1 or seed.shape[0] == batch)
              and seed.dtype == torch.int64 and seed.device == device
              and offset.dim() == 1 and (offset.shape[0] == 1 or offset.shape[0] == batch)
              and offset.dtype == torch.int64 and offset.device == device)
    if not ok:
        _raise_first_problem(draft_probs, draft_token_ids, target_probs, accepted_num,
                             emitted_num, seed, offset, names, counters_optional)


def _raise_first_problem(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num,
                         seed, offset, names: ArgumentNames,
                         counters_optional: bool = False) -> None:
    """The slow path of check_arguments: find the first problem and raise its error."""
    require_tensor(names.target_probs, target_probs)
    if target_probs.dim() != 3:
        raise ValueError(
            f"{names.target_probs} must have shape (batch_size, num_speculate_tokens + 1, "
            f"vocab_size); got {target_probs.dim()}-D shape {shape(target_probs)}"
        )
    if target_probs.dtype not in PROB_DTYPES:
        raise dtype_error(names.target_probs, target_probs, PROB_DTYPES)
    batch, n_plus_one, vocab = target_probs.shape
    device = target_probs.device
    if n_plus_one < 1:
        raise ValueError(
            f"{names.target_probs} must have num_speculate_tokens + 1 >= 1 positions (0 drafts: "
            f"one token from the single row); got shape {shape(target_probs)}"
        )
    if vocab < 1:
        raise ValueError(
            f"{names.target_probs} must have vocab_size >= 1; got shape {shape(target_probs)}")
    num_draft = n_plus_one - 1

    require_tensor(names.draft_token_ids, draft_token_ids)
    if draft_token_ids.dim() != 2 or draft_token_ids.shape[0] != batch \
            or draft_token_ids.shape[1] != num_draft:
        raise _ids_shape_error(names, draft_token_ids, target_probs)
    if draft_token_ids.dtype not in INDEX_DTYPES:
        raise dtype_error(names.draft_token_ids, draft_token_ids, INDEX_DTYPES)
    if draft_token_ids.device != device:
        raise device_error(names.draft_token_ids, draft_token_ids, device, names.target_probs)

    if draft_probs is not None:
        require_tensor(names.draft_probs, draft_probs)
        if draft_probs.dim() != 3 or draft_probs.shape[0] != batch \
                or draft_probs.shape[1] != num_draft or draft_probs.shape[2] != vocab:
            raise ValueError(
                f"{names.draft_probs} must have shape (batch_size, num_speculate_tokens, "
                f"vocab_size) = {(batch, num_draft, vocab)} to match {names.target_probs} "
                f"{shape(target_probs)}; got {shape(draft_probs)}"
            )
        if draft_probs.dtype != target_probs.dtype:
            raise TypeError(
                f"{names.draft_probs} must have the dtype of {names.target_probs} "
                f"({dtype_name(target_probs.dtype)}); got {dtype_name(draft_probs.dtype)}"
            )
        if draft_probs.device != device:
            raise device_error(names.draft_probs, draft_probs, device, names.target_probs)

    _check_counter(names.accepted_num, accepted_num, batch, device, names.target_probs,
                   counters_optional)
    _check_counter(names.emitted_num, emitted_num, batch, device, names.target_probs,
                   counters_optional)
    _check_seed_like(names.seed, seed, batch, device, names.target_probs)
    _check_seed_like(names.offset, offset, batch, device, names.target_probs)


def check_counters_apart(
    *,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    names: ArgumentNames = OP_NAMES,
) -> None:
    """Raise ValueError when the two counters share memory: the kernels add to both in place, so
    a request's sums would depend on the order the hardware runs them in (the interpreter would
    silently add every request into one slot). Call it after ``check_arguments``, which refuses a
    counter with stride 0.

    Separate from ``check_arguments`` because Dynamo cannot trace the storage comparison: the
    fake implementation runs it at trace time, on fake tensors that keep the inputs' aliasing.
    """
    if torch._C._is_alias_of(accepted_num, emitted_num) and overlaps(accepted_num, emitted_num):
        raise ValueError(
            f"{names.accepted_num} and {names.emitted_num} must not share memory: each call adds "
            "to both in place; pass two separate tensors"
        )


def counters_apart(accepted_num: torch.Tensor, emitted_num: torch.Tensor, seed: torch.Tensor,
                   names: ArgumentNames = OP_NAMES) -> torch.Tensor:
    """``check_counters_apart`` for a public function, eagerly and under ``torch.compile``; returns
    the seed tensor the call's op is to read. Dynamo cannot trace the storage comparison, nor does
    it guard against views that overlap on a later call (and a compiled op that mutates the
    counters works on copies), so there an op runs the check: its fake at trace time, its kernel
    on every call of the compiled code. That op passes the seed through (a copy), so that the
    verifying op depends on it: compilers keep it, and run it first."""
    if torch.compiler.is_compiling():
        return _counters_apart(accepted_num, emitted_num, seed, names.accepted_num,
                               names.emitted_num)
    check_counters_apart(accepted_num=accepted_num, emitted_num=emitted_num, names=names)
    return seed


def _check_apart(accepted_num, emitted_num, seed, accepted_name, emitted_name) -> torch.Tensor:
    check_counters_apart(accepted_num=accepted_num, emitted_num=emitted_num,
                         names=ArgumentNames(accepted_num=accepted_name,
                                             emitted_num=emitted_name))
    return seed.clone()


_counters_apart = torch.library.custom_op(
    "specops::counters_apart", _check_apart, mutates_args=(),
    schema="(Tensor accepted_num, Tensor emitted_num, Tensor seed, str accepted_name, "
           "str emitted_name) -> Tensor")
_counters_apart.register_fake(_check_apart)


def _ids_shape_error(names: ArgumentNames, ids: torch.Tensor, target: torch.Tensor) -> ValueError:
    """Say which argument's shape implies what, blaming neither when both are well-formed."""
    batch, n_plus_one, _ = target.shape
    expected = (batch, n_plus_one - 1)
    if ids.dim() == 2 and ids.shape[0] == batch:
        # Both well-formed, numbers of positions disagree: either may be the wrong one.
        return ValueError(
            f"{names.draft_token_ids} and {names.target_probs} disagree on the number of draft "
            f"tokens: {names.draft_token_ids} of shape {shape(ids)} has {ids.shape[1]} per "
            f"request, so {names.target_probs} needs {ids.shape[1]} + 1 = {ids.shape[1] + 1} "
            f"positions, shape ({batch}, {ids.shape[1] + 1}, vocab_size); {names.target_probs} of "
            f"shape {shape(target)} has {n_plus_one} positions, which implies "
            f"{names.draft_token_ids} of shape (batch_size, num_speculate_tokens) = {expected}"
        )
    return ValueError(
        f"{names.draft_token_ids} must have shape (batch_size, num_speculate_tokens) = {expected} "
        f"to match {names.target_probs} {shape(target)}; got {shape(ids)}"
    )


def check_values(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    names: ArgumentNames = OP_NAMES,
    probabilities: bool = True,
    vocab: int | None = None,
    rows_read: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """SPECOPS_VALIDATE=1: reject data that the op would otherwise tolerate silently.

    Ids must be -1 (padding) or in [0, vocab_size); probabilities must lie in
    [0, PROBABILITY_BOUND) (finite, and too small to overflow a chunk's float32 sum), and the rows
    the op reads must sum to 1 or 0 (``check_row_masses``). vocab: the vocabulary size, when the
    rows are a shard of it (default: the rows' width; a shard's masses are not checked here).
    rows_read: (the target's (..., N + 1), the draft's (..., N)) bool, the rows the op reads; by
    default those of padded drafts (``padded_rows_read``).
    """
    whole_rows = vocab is None
    vocab = target_probs.shape[-1] if vocab is None else vocab
    ids = draft_token_ids.long()  # an int32 tensor compared with a vocab past its range wraps it
    where = first_bad_index((ids < -1) | (ids >= vocab))
    if where is not None:
        value = int(draft_token_ids[where])
        raise ValueError(
            f"{names.draft_token_ids} must be -1 (padding) or in [0, {vocab}); "
            f"got {value} at index {where} (SPECOPS_VALIDATE=1)"
        )
    # probabilities=False: target_probs holds logits, which their own check reads.
    checked = ((names.target_probs, target_probs if probabilities else None),
               (names.draft_probs, draft_probs))
    for name, probs in checked:
        if probs is None:
            continue
        where = first_bad_index(~((probs >= 0) & (probs < PROBABILITY_BOUND)))
        if where is not None:
            raise ValueError(
                f"{name} must be finite, >= 0 and below 2**117; got {float(probs[where])} at "
                f"index {where} (SPECOPS_VALIDATE=1)"
            )
    if not whole_rows:
        return
    if rows_read is None:
        rows_read = padded_rows_read(draft_token_ids, vocab)
    for (name, probs), read in zip(checked, rows_read):
        if probs is not None:
            check_row_masses(name, probs, read)


def padded_rows_read(draft_token_ids: torch.Tensor, vocab: int):
    """(target's (B, N + 1), draft's (B, N)) bool: the rows a chain op may read. A draft id
    outside [0, vocab) ends the request's drafts: no row past it is read, nor its own draft row."""
    drafting = ((draft_token_ids >= 0) & (draft_token_ids < vocab)).int().cumprod(dim=-1).bool()
    return torch.cat([torch.ones_like(drafting[..., :1]), drafting], dim=-1), drafting
