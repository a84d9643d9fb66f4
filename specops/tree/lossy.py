"""Opt-in lossy acceptance for a tree verified from logits (docs/semantics.md, "Lossy
acceptance"), Medusa's own setting: a node is kept where its parent is and its token passes the
rule's test under its parent's processed row (core/logits/acceptance.py); the path to the deepest
kept node (the first in node order among equals; the root where none is kept) is emitted, then
one token from that node's row: its argmax where the node has children (all rejected) under
typical acceptance, a draw from the row otherwise. The tokens do NOT follow the target's
distribution.

Composed of registered ops (the logprobs op, each row's children and entropy at once, and the
exact tree op on one row a request for the last token) and torch operations on (B, M) values;
rule step 0 is applied as those ops read the logits (each node's row counting its path), so the
rows written are that one row a request."""

from __future__ import annotations

import torch

from ..core.logits.acceptance import rate_passes, typical_passes
from ..core.logits.rule import Step, generated_counts
from ..core.logprobs.op import token_logprobs_op
from .processed import paths


def lossy_tree(exact_op, draft_token_ids, parents, logits, seed, offset, parameters, order,
               posterior_threshold=None, posterior_alpha=None, acceptance_rate=None,
               step: Step = Step()):
    """(output_token_ids (B, M + 1), output_node_ids (B, M), emitted (B,)), int32, as the tree
    op's, of rows of logits (B, M + 1, V), rule step 0 ``step`` applied as they are read.
    ``exact_op``: the tree's exact from-logits op, which draws the last token."""
    batch, rows, vocab = logits.shape
    nodes = rows - 1
    ids, given = draft_token_ids.long(), parents.long()
    index = torch.arange(nodes, device=logits.device)
    linked = (ids >= 0) & (ids < vocab) & (given >= 0) & (given <= index)
    parent = torch.where(linked, given, 0)
    lists = None  # each node's path, which only penalties read
    if step.penalties() is not None:
        lists = paths(ids, given, vocab)
    if acceptance_rate is None:
        # Row p's tokens: column i holds node i's where p is its parent (-1 elsewhere).
        row = torch.arange(rows, device=logits.device)[:, None]
        children = torch.where(linked[:, None, :] & (parent[:, None, :] == row), ids[:, None, :],
                               -1)
        logprobs, _, _, entropy = token_logprobs_op(logits, children, *parameters, 0, order,
                                                    True, lists, None, *step)
        logprobs = logprobs.gather(1, parent[:, None, :])[:, 0]  # node i's under its parent
        entropy = entropy.gather(1, parent)
        passes = typical_passes(logprobs, entropy, posterior_threshold, posterior_alpha)
    else:
        passes = rate_passes(seed, offset, batch, vocab, nodes, acceptance_rate)
    # Kept where the parent is kept (the root always is); depth along the way. Parents come
    # before their children, so one pass over the nodes settles both.
    request = torch.arange(batch, device=logits.device)
    kept = torch.ones(batch, rows, dtype=torch.bool, device=logits.device)
    depth = torch.zeros(batch, rows, dtype=torch.int64, device=logits.device)
    for i in range(nodes):
        kept[:, i + 1] = linked[:, i] & passes[:, i] & kept[request, parent[:, i]]
        depth[:, i + 1] = depth[request, parent[:, i]] + 1
    best = torch.where(kept, depth, -1).argmax(dim=1)  # the first of the deepest kept nodes
    length = depth[request, best]
    # The path: each ancestor of the deepest node (the root aside) at its depth - 1; a spare
    # last column takes the root's writes.
    path = torch.full((batch, rows), -1, dtype=torch.int64, device=logits.device)
    node = best
    for _ in range(nodes):
        path[request, torch.where(node > 0, depth[request, node] - 1, nodes)] = node
        node = torch.where(node > 0, parent[request, (node - 1).clamp(min=0)], 0)
    path = path[:, :nodes]
    tokens = torch.where(path >= 0, ids.gather(1, (path - 1).clamp(min=0)), -1)
    # The last token, from the deepest node's row, by the exact op on that row alone.
    has_children = (linked & (parent == best[:, None])).any(dim=1)
    temperature = parameters[0].expand(batch)
    if acceptance_rate is None:
        temperature = torch.where(has_children, torch.zeros_like(temperature), temperature)
    # A tree of one absent node: the root's row is the deepest node's, its path counted.
    last_rows = logits[request, best][:, None].expand(batch, 2, vocab).contiguous()
    bitmask, counts = step.allowed_token_bitmask, step.output_token_counts
    if bitmask is not None:
        bitmask = bitmask[request, best][:, None].expand(batch, 2, -1).contiguous()
    if lists is not None:
        row_path = lists[request, best]
        counts = generated_counts(counts, row_path, torch.ones_like(row_path, dtype=torch.bool))
    last_step = step._replace(allowed_token_bitmask=bitmask, output_token_counts=counts)
    absent = torch.full((batch, 1), -1, dtype=torch.int64, device=logits.device)
    last = exact_op(None, absent, torch.zeros_like(absent), last_rows, None, seed, offset,
                    temperature, *parameters[1:], True, None, None, None, None, *last_step,
                    order)[0][:, 0]
    position = torch.arange(rows, device=logits.device)
    padded = torch.cat([tokens, absent], dim=1)
    output = torch.where(position < length[:, None], padded,
                         torch.where(position == length[:, None], last[:, None].long(), -1))
    return output.int(), path.int(), length.int()
