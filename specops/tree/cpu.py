"""The CPU backend of tree speculative sampling: the reference's steps, forming only the rows a step
needs.

The reference forms a vocabulary row for every request at every step of its walk, whether the
request needs one there or not (it must not read data on the host to find out). On CPU tensors a
question about the data costs no synchronisation, so this backend asks two: which requests need a
row at this step (those that just rejected a child, with draft probabilities; those still walking,
target-only), and whether every walk has ended. Each row it forms is the reference's row, from the
same functions, so the tokens are the reference's (tests/test_tree_op.py checks them).
"""

from __future__ import annotations

import functools

import torch

from ..core.ops.backends import in_inference_mode
from ..core.sampling.probs import sanitize
from ..core.sampling.race import CHUNK_SIZE, chunk_masses, race_winner, token_in_chunk
from ..core.sampling.sums import exact_total
from ..core.logits import cpu as logits_cpu, rule
from . import reference, slots
from . import traversal_reference as traversal
from .processed import on_processed_rows

# PROBABILITY_BOUND (2**117) as float32 bits: (117 + 127) << 23.
_BOUND_BITS = (117 + 127) << 23


def _sanitized(rows: torch.Tensor) -> torch.Tensor:
    """sanitize(rows), without its pass when every value is already in [0, PROBABILITY_BOUND):
    the bit patterns of those float32 values are exactly the int32 values in [0, _BOUND_BITS)."""
    rows = rows.float()
    if rows.numel():
        low, high = torch.aminmax(rows.view(torch.int32))
        if int(low) >= 0 and int(high) < _BOUND_BITS:
            return rows
    return sanitize(rows)


def _sample(rows: torch.Tensor, u_race: torch.Tensor, u_cdf: torch.Tensor) -> torch.Tensor:
    """core.sampling.race.sample_rows of contiguous rows, reading the winning chunk where it lies instead
    of a padded copy of every row: the same race, and the same inverse CDF (the padding is zeros,
    which add nothing to a prefix sum)."""
    chunk, key = race_winner(chunk_masses(rows), -torch.log(u_race.double()))
    token = chunk * CHUNK_SIZE + token_in_chunk(rows, chunk, u_cdf)
    return torch.where(torch.isfinite(key), token, -1)


def _rows(probs: torch.Tensor, index: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """Sanitised row probs[b, node[b]] of each request b in ``index``."""
    batch, positions, vocab = probs.shape
    if probs.stride(0) != positions * probs.stride(1) or probs.stride(2) != 1:
        return _sanitized(probs[index, node[index]])  # e.g. expand()ed over the batch
    # One index_select of the flattened rows: a plain copy of each row, faster than the gather.
    flat = probs.reshape(batch * positions, vocab)
    return _sanitized(flat.index_select(0, index * positions + node[index]))


def _subset_masses(draft_probs, target_probs, node, weight, needed) -> torch.Tensor:
    index = needed.nonzero().squeeze(1)
    mass = torch.ones(node.shape[0], dtype=torch.float64)
    if index.numel():
        residual = reference.residual_rows(_rows(target_probs, index, node),
                                           _rows(draft_probs, index, node), weight[index])
        mass[index] = exact_total(chunk_masses(residual))
    return mass


def _subset_draws(target_probs, node, u, needed) -> torch.Tensor:
    index = needed.nonzero().squeeze(1)
    token = torch.full((node.shape[0],), -1, dtype=torch.int64)
    if index.numel():
        token[index] = _sample(_rows(target_probs, index, node), u[index, 1:], u[index, 0])
    return token


def _draw_token(draft_probs, target_probs, walk, state, seed, offset) -> torch.Tensor:
    """reference.draw_token, forming each request's one row: its residual or its target row."""
    batch, num_nodes = walk.path.shape
    vocab = target_probs.shape[2]
    everyone = torch.arange(batch)
    rows = _rows(target_probs, everyone, walk.node)
    residual = ((state.rejections > 0) & (state.mass > 0)).nonzero().squeeze(1)
    if residual.numel():
        rows[residual] = reference.residual_rows(rows[residual],
                                                 _rows(draft_probs, residual, walk.node),
                                                 state.weight[residual])
    u = reference.request_uniforms(seed, offset, batch, slots.slots_per_draw(vocab),
                                   slots.draw_slot(vocab, 0))
    return _sample(rows, u[:, 1:], u[:, 0])


def _all_done(done: torch.Tensor) -> bool:
    return bool(done.all())


# The reference's rules, these steps forming only the rows a step needs.
STEPS = reference.Steps(_subset_masses, _subset_draws, _all_done, _draw_token)


@in_inference_mode
def tree_speculative_sampling_cpu(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    target_probs: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    with_replacement: bool = True,
    verification: str = "token",
):
    """``reference.tree_speculative_sampling_reference`` for CPU tensors, faster."""
    if verification == "traversal" and draft_probs is not None:
        return traversal.verify(draft_probs, draft_token_ids, parents, target_probs, seed,
                                offset, with_replacement, _subset_masses, _all_done, _draw_token)
    return reference.verify(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                            with_replacement, STEPS)


# Verification from logits: every row processed as core/logits/cpu.py processes it (the rule's rows,
# bit for bit, with less work), then the above.
tree_speculative_sampling_from_logits_cpu = on_processed_rows(
    tree_speculative_sampling_cpu,
    functools.partial(rule.processed_requests, process=logits_cpu.processed_rows))
