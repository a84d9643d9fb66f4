"""Engines' tree layouts turned into the tree op's: node tokens and ``parents`` (docs/tree.md,
"Token trees").

SGLang (EAGLE's tree verification) numbers a request's nodes 0..M, node 0 the root (the last
accepted token), and links them as lists: ``retrive_next_token[b, n]`` is node n's first child and
``retrive_next_sibling[b, n]`` the next child of n's parent, -1 ending a list. Its target rows are
laid out as the op's (row n: after the path to node n), so only the links change.
"""

from __future__ import annotations

import torch


def from_sglang(candidates: torch.Tensor, retrive_next_token: torch.Tensor,
                retrive_next_sibling: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft_token_ids (B, M), parents (B, M)) of the trees SGLang's layout describes.

    candidates: (B, M + 1) node tokens, node 0 the root (its token is not a draft);
    retrive_next_token, retrive_next_sibling: (B, M + 1), -1 where a list ends.

    A node no list reaches (SGLang's tree builder skips a token whose parent was not selected)
    gets token -1 and parent -1: an absent node, and so, for the op, is every node below it. A
    node whose parent comes after it would be malformed; SGLang's builder never makes one. The op
    tries siblings in node order: SGLang's builder links each node in front of its parent's list,
    from the last node to the first, so its lists run in node order too. Vectorised, without reading data on the host (so it can sit
    in a captured decode step): one pass per position in the longest list, at most M.
    """
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
