"""What a tree's verifier from logits adds to its outputs when a caller asks for logprobs
(docs/api.md, "Logprobs"): each output position's token under the row of the node it was drawn
at, after rule step 0 for "processed" (each node's row counting its path as generated)."""

from __future__ import annotations

import torch

from ..core.logits.rule import Step
from ..core.logprobs.outputs import run
from .processed import paths


def tree_logprobs(mode, num_top: int, target_logits, draft_token_ids, parents, output,
                  output_node_ids, parameters, step: Step, order: str) -> tuple:
    """A tree's (B, M + 1) outputs' logprobs: position 0's token under the root's row, position
    j's under the row of the j-th accepted node."""
    if mode is None:
        return ()
    nodes = target_logits.shape[1]
    source = torch.cat([torch.zeros_like(output_node_ids[:, :1]), output_node_ids],
                       dim=1).long().clamp(0, nodes - 1)  # (B, M + 1): each position's row
    has = output >= 0
    slot = torch.where(has, source, nodes)  # nodes: a spare column for the padding
    tokens = output.new_full((output.shape[0], nodes + 1), -1).scatter(1, slot, output)
    lists = None  # each node's path, which only penalties read
    if mode == "processed" and step.penalties() is not None:
        lists = paths(draft_token_ids, parents, target_logits.shape[-1])
    result = run(mode, num_top, target_logits, tokens[:, :nodes], parameters, order, lists, None,
                 step)
    return tuple(_at_positions(value, source, has) for value in result)


def _at_positions(value, source, has):
    """The op's per-row result (B, rows, ...) read at each output position's row ``source``
    (B, M + 1); -inf and -1 where the position has no token."""
    index = source.view(*source.shape, *([1] * (value.dim() - 2)))
    taken = value.gather(1, index.expand(*source.shape, *value.shape[2:]))
    mask = has.view(*has.shape, *([1] * (taken.dim() - 2)))
    return torch.where(mask, taken, -1 if value.dtype == torch.int32 else -torch.inf)
