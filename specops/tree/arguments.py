"""The tree op's arguments, checked: the same checks in the eager implementations and the fake one,
so bad input raises the same error in eager mode and under ``torch.compile``.

``check_arguments`` runs on every call, so the happy path is one run of cheap comparisons;
messages are built only when raising. ``check_values`` is the opt-in ``SPECOPS_VALIDATE=1`` mode
(docs/api.md, "Environment variables"): it reads the data, so it runs in eager execution only.
"""

from __future__ import annotations

import torch

from ..core.ops.checks import (check_row_masses, device_error, dtype_error, dtype_name,
                               first_bad_index, require_tensor, shape)
from ..core.sampling.probs import PROBABILITY_BOUND

PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_arguments(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                    with_replacement, target_name: str = "target_probs") -> None:
    """Raise ValueError (shapes, devices) or TypeError (types, dtypes) naming the argument
    (``target_name``: what the caller calls target_probs, e.g. target_logits)."""
    # Types and the target's rank first: Dynamo hands no exception raised in this pass to an
    # except clause, so nothing here may raise one.
    ok = (all(isinstance(t, torch.Tensor)
              for t in (draft_token_ids, parents, target_probs, seed, offset))
          and (draft_probs is None or isinstance(draft_probs, torch.Tensor))
          and target_probs.dim() == 3)
    if ok:
        size = target_probs.shape
        device = target_probs.device
        batch = size[0]
        nodes = (batch, size[1] - 1)
        ok = (size[1] >= 2 and size[2] >= 1
              and target_probs.dtype in PROB_DTYPES
              and draft_token_ids.shape == nodes and draft_token_ids.dtype in INDEX_DTYPES
              and draft_token_ids.device == device
              and parents.shape == nodes and parents.dtype in INDEX_DTYPES
              and parents.device == device
              and (draft_probs is None
                   or (draft_probs.shape == size and draft_probs.dtype == target_probs.dtype
                       and draft_probs.device == device))
              and seed.dim() == 1 and (seed.shape[0] == 1 or seed.shape[0] == batch)
              and seed.dtype == torch.int64 and seed.device == device
              and offset.dim() == 1 and (offset.shape[0] == 1 or offset.shape[0] == batch)
              and offset.dtype == torch.int64 and offset.device == device
              and isinstance(with_replacement, bool))
    if not ok:
        _raise_first_problem(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                             with_replacement, target_name)


def _raise_first_problem(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                         with_replacement, target: str) -> None:
    """The slow path of check_arguments: find the first problem and raise its error."""
    require_tensor(target, target_probs)
    if target_probs.dim() != 3:
        raise ValueError(
            f"{target} must have shape (batch_size, num_nodes + 1, vocab_size); got "
            f"{target_probs.dim()}-D shape {shape(target_probs)}")
    if target_probs.dtype not in PROB_DTYPES:
        raise dtype_error(target, target_probs, PROB_DTYPES)
    batch, rows, vocab = target_probs.shape
    device = target_probs.device
    if rows < 2:
        raise ValueError(f"{target} must have num_nodes + 1 >= 2 rows (the root's and one "
                         f"node's); got shape {shape(target_probs)}")
    if vocab < 1:
        raise ValueError(
            f"{target} must have vocab_size >= 1; got shape {shape(target_probs)}")
    nodes = (batch, rows - 1)
    for name, t in (("draft_token_ids", draft_token_ids), ("parents", parents)):
        require_tensor(name, t)
        if tuple(t.shape) != nodes:
            raise ValueError(
                f"{name} must have shape (batch_size, num_nodes) = {nodes} to match {target} "
                f"{shape(target_probs)} (num_nodes + 1 rows); got {shape(t)}")
        if t.dtype not in INDEX_DTYPES:
            raise dtype_error(name, t, INDEX_DTYPES)
        if t.device != device:
            raise device_error(name, t, device, target)
    if draft_probs is not None:
        require_tensor("draft_probs", draft_probs)
        if tuple(draft_probs.shape) != (batch, rows, vocab):
            raise ValueError(
                "draft_probs must have shape (batch_size, num_nodes + 1, vocab_size) = "
                f"{(batch, rows, vocab)}, the shape of {target}; got {shape(draft_probs)}")
        if draft_probs.dtype != target_probs.dtype:
            raise TypeError(
                f"draft_probs must have the dtype of {target} "
                f"({dtype_name(target_probs.dtype)}); got {dtype_name(draft_probs.dtype)}")
        if draft_probs.device != device:
            raise device_error("draft_probs", draft_probs, device, target)
    for name, t in (("seed", seed), ("offset", offset)):
        require_tensor(name, t)
        if t.dim() != 1 or (t.shape[0] != 1 and t.shape[0] != batch):
            raise ValueError(f"{name} must be a 1-D tensor of 1 or batch_size ({batch}) "
                             f"elements; got shape {shape(t)}")
        if t.dtype != torch.int64:
            raise dtype_error(name, t, (torch.int64,))
        if t.device != device:
            raise device_error(name, t, device, target)
    if not isinstance(with_replacement, bool):
        raise TypeError(
            f"with_replacement must be a bool; got {type(with_replacement).__name__}")


VERIFICATIONS = ("token", "traversal")


def check_verification(verification) -> None:
    """``verification``: one of VERIFICATIONS (docs/tree.md, "Traversal verification")."""
    if verification not in VERIFICATIONS:
        raise ValueError(f'verification must be "token" (node by node from the root) or '
                         f'"traversal" (from the leaves, judging whole paths); got '
                         f"{verification!r}")


def present_nodes(draft_token_ids: torch.Tensor, parents: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, M + 1) bool: the root (column 0) and every present node (docs/tree.md, "Tree
    verification", rule 1)."""
    ids, given = draft_token_ids.long(), parents.long()
    batch, num_nodes = ids.shape
    present = torch.zeros(batch, num_nodes + 1, dtype=torch.bool, device=ids.device)
    present[:, 0] = True
    for i in range(num_nodes):  # a parent comes before its children
        parent = given[:, i]
        linked = (ids[:, i] >= 0) & (ids[:, i] < vocab) & (parent >= 0) & (parent <= i)
        present[:, i + 1] = linked & present.gather(1, parent.clamp(0, i)[:, None]).squeeze(1)
    return present


def check_values(draft_probs, draft_token_ids, parents, target_probs, logits=None) -> None:
    """SPECOPS_VALIDATE=1: reject data that the op would otherwise tolerate silently.

    ``logits``: (target_logits, draft_logits or None) where the rows are given as logits
    (target_probs is then target_logits): a NaN or +inf logit is refused in the rows the op
    reads (-inf, a mask, is a logit).

    Ids must be -1 (padding) or in [0, vocab_size); a node with an id in range must have a parent
    in [0, i] (node i + 1); the probabilities the op may read (the target rows of the root and of
    present nodes, the draft rows of those with a present child) must lie in [0, 2**117) and sum
    to 1 or 0 (``check_row_masses``). The rows of absent nodes and of leaves' drafts are not read,
    so they are not checked.
    """
    vocab = target_probs.shape[-1]
    where = first_bad_index((draft_token_ids < -1) | (draft_token_ids >= vocab))
    if where is not None:
        raise ValueError(
            f"draft_token_ids must be -1 (padding) or in [0, {vocab}); got "
            f"{int(draft_token_ids[where])} at index {where} (SPECOPS_VALIDATE=1)")
    index = torch.arange(draft_token_ids.shape[1], device=parents.device)
    given = parents.long()
    where = first_bad_index((draft_token_ids >= 0) & ((given < 0) | (given > index)))
    if where is not None:
        raise ValueError(
            f"parents must give node i + 1 a parent in [0, i] (0 is the root) wherever its "
            f"token is in [0, {vocab}); got {int(parents[where])} for node {where[1] + 1} at "
            f"index {where} (SPECOPS_VALIDATE=1)")
    present = present_nodes(draft_token_ids, parents, vocab)
    parent_of = torch.where(present[:, 1:], given, -1)  # (B, M): -1 for absent nodes
    node = torch.arange(present.shape[1], device=parents.device)
    has_child = (parent_of[:, :, None] == node[None, None, :]).any(dim=1)  # (B, M + 1)
    given = () if logits is None else (("target_logits", logits[0], present),
                                       ("draft_logits", logits[1], present & has_child))
    for name, rows, read in given:
        if rows is None:
            continue
        where = first_bad_index((torch.isnan(rows) | (rows == torch.inf)) & read[:, :, None])
        if where is not None:
            raise ValueError(f"{name} must be a number or -inf in the rows the op reads; got "
                             f"{float(rows[where])} at index {where} (SPECOPS_VALIDATE=1)")
    for name, probs, read in (("target_probs", None if logits else target_probs, present),
                              ("draft_probs", draft_probs, present & has_child)):
        if probs is None:
            continue
        where = first_bad_index(~((probs >= 0) & (probs < PROBABILITY_BOUND)) & read[:, :, None])
        if where is not None:
            raise ValueError(
                f"{name} must be finite, >= 0 and below 2**117 in the rows the op reads; got "
                f"{float(probs[where])} at index {where} (SPECOPS_VALIDATE=1)")
        check_row_masses(name, probs, read)
