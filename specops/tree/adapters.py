"""Engines' tree layouts turned into the tree op's: node tokens and ``parents`` (docs/tree.md,
"Token trees").

SGLang (EAGLE's tree verification) numbers a request's nodes 0..M, node 0 the root (the last
accepted token), and links them as lists: ``retrive_next_token[b, n]`` is node n's first child and
``retrive_next_sibling[b, n]`` the next child of n's parent, -1 ending a list. Its target rows are
laid out as the op's (row n: after the path to node n), so only the links change.
"""

from __future__ import annotations

import torch

from ..core.ops.checks import (device_error, dtype_error, first_bad_index, require_tensor, shape,
                               validation_enabled)
from .arguments import INDEX_DTYPES

LINKS = ("retrive_next_token", "retrive_next_sibling")


def _check_arguments(candidates, links) -> None:
    """Raise TypeError (types, dtypes) or ValueError (shapes, devices) naming the argument: shapes,
    dtypes and devices only, so it runs eagerly and under torch.compile alike, with no host sync."""
    require_tensor("candidates", candidates)
    if candidates.dim() != 2:
        raise ValueError(f"candidates must have shape (batch_size, num_nodes + 1); got "
                         f"{candidates.dim()}-D shape {shape(candidates)}")
    if candidates.shape[1] < 1:
        raise ValueError(f"candidates must have num_nodes + 1 >= 1 columns (the root's); got "
                         f"shape {shape(candidates)}")
    if candidates.dtype not in INDEX_DTYPES:
        raise dtype_error("candidates", candidates, INDEX_DTYPES)
    for name, t in zip(LINKS, links):
        require_tensor(name, t)
        if t.shape != candidates.shape:
            raise ValueError(f"{name} must have shape (batch_size, num_nodes + 1) = "
                             f"{shape(candidates)} to match candidates {shape(candidates)}; got "
                             f"{shape(t)}")
        if t.dtype not in INDEX_DTYPES:
            raise dtype_error(name, t, INDEX_DTYPES)
        if t.device != candidates.device:
            raise device_error(name, t, candidates.device, "candidates")


def _check_values(links) -> None:
    """SPECOPS_VALIDATE=1: refuse a link that names no node (unvalidated, it is ignored)."""
    last = links[0].shape[1] - 1
    for name, t in zip(LINKS, links):
        where = first_bad_index((t < -1) | (t > last))
        if where is not None:
            raise ValueError(f"{name} must be -1 (end of list) or a node in [0, {last}]; got "
                             f"{int(t[where])} at index {where} (SPECOPS_VALIDATE=1)")


def from_sglang(candidates: torch.Tensor, retrive_next_token: torch.Tensor,
                retrive_next_sibling: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft_token_ids (B, M), parents (B, M)) of the trees SGLang's layout describes.

    candidates: (B, M + 1) node tokens, node 0 the root (its token is not a draft);
    retrive_next_token, retrive_next_sibling: (B, M + 1), -1 where a list ends.

    A node no list reaches (SGLang's tree builder skips a token whose parent was not selected)
    gets token -1 and parent -1: an absent node, and so, for the op, is every node below it. A
    node whose parent comes after it would be malformed; SGLang's builder never makes one. The op
    tries siblings in node order: SGLang's builder links each node in front of its parent's list,
    from the last node to the first, so its lists run in node order too. Vectorised, without
    reading data on the host (so it can sit in a captured decode step): one pass per position in
    the longest list, at most M.

    The arguments' types, shapes, dtypes (int32 or int64) and devices are checked on every call;
    under SPECOPS_VALIDATE=1 the links' values too (in [-1, M]), eagerly only: that reads them on
    the host, which a compiled graph cannot.
    """
    links = (retrive_next_token, retrive_next_sibling)
    _check_arguments(candidates, links)
    if not torch.compiler.is_compiling() and validation_enabled():
        _check_values(links)
    batch, width = retrive_next_token.shape
    device = retrive_next_token.device
    node = torch.arange(width, device=device).expand(batch, width)
    first = retrive_next_token.long()
    sibling = retrive_next_sibling.long()

    def linked(target, source, keep):
        """parent[target] = source where keep (a spare last column takes the rest); the largest
        value wins where links collide, as only malformed lists make them."""
        index = torch.where(keep & (target >= 1) & (target < width), target, width)
        out = torch.full((batch, width + 1), -1, dtype=torch.int64, device=device)
        return out.scatter_reduce_(1, index, torch.where(keep, source, -1), "amax")[:, :width]

    parent = linked(first, node, torch.ones_like(first, dtype=torch.bool))
    for _ in range(width - 1):  # every sibling takes its predecessor's parent
        parent = torch.maximum(parent, linked(sibling, parent, parent >= 0))
    parent = parent[:, 1:]
    tokens = torch.where(parent >= 0, candidates[:, 1:].long(), -1)
    return tokens.to(candidates.dtype), parent
