"""The Triton kernel of tree speculative sampling (CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``); ``launch.py`` launches it. docs/internals/kernel.md ("The tree kernel") explains
the design.

Grid (B,): program b walks request b's tree from the root, as ``reference.py`` does, and reads the
rows of the nodes it stands on only. The nodes' tokens and parents are vectors of BLOCK_M lanes
(lane l is node l + 1, and output position l). Judging a child takes two scalar gathers, p(x)
and q(x), and its coin; each rejection is one pass over the node's row pair that forms the next
residual relu(w p - q), its exact mass and the race keys of the residual and of p; target-only,
each node is one pass over its target row and a draw. The token at the node where the walk stops
is one inverse CDF in its race's winning chunk. No partials, no host synchronisation: the outputs
are the only allocations.

The algorithm is that of ``reference.py``, token for token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.sampling.philox import philox_uniform, split_int64
from ..core.sampling.race_triton import (keep_best, masses_p, masses_residual, race_group,
                                         race_start, race_token)
from ..core.sampling.step_triton import (PENALTIES, WORD_BITS, adjusted_at, drafts_before,
                                         request_step, row_step)
from ..core.sampling.sums_triton import BIN_LANES, add_masses, to_float
from ..core.sampling.probs_triton import widen
from ..core.sampling.values_triton import STATS, probabilities_at

# Verification from logits: the kernels read the logits through their rows' statistics
# (core/logits/triton.py), LOGITS and DRAFT_LOGITS being values_triton.ONE_HOT (a greedy row is
# one-hot), the target's after rule step 0 where STEP is on; a node's rows are the tuple
# ``node_rows`` makes (pointers to its target and draft rows and their statistics, and its
# context of step 0), which every stage below takes.


@triton.jit
def tree_step(b, num_nodes, vocab, paths_ptr, stride_path_b, stride_path_k, stride_path_n,
              bias_ptr, bitmask_ptr, counts_ptr, prompt_ptr, penalties_ptr, penalty_stride,
              STEP: tl.constexpr):
    """Request b's context of rule step 0 (STEP on): (its request context, its first row's
    bitmask words, its paths' base and strides: a node's tokens, and from node to node)."""
    request = request_step(b, vocab, bias_ptr, counts_ptr, prompt_ptr, penalties_ptr,
                           penalty_stride, STEP)
    return (request, bitmask_ptr + b * (num_nodes + 1) * tl.cdiv(vocab, WORD_BITS),
            paths_ptr + b * stride_path_b, stride_path_k, stride_path_n)


@triton.jit
def request_tree(b, num_nodes, vocab, target_ptr, draft_ptr, stride_tb, stride_tn, stride_db,
                 stride_dn, target_stats_ptr, draft_stats_ptr, paths_ptr, stride_path_b,
                 stride_path_k, stride_path_n, bias_ptr, bitmask_ptr, counts_ptr, prompt_ptr,
                 penalties_ptr, penalty_stride, STEP: tl.constexpr):
    """Request b's ``tree`` and ``step`` (``node_rows``' arguments), from the tree kernels'."""
    tree = (target_ptr + b * stride_tb, draft_ptr + b * stride_db, stride_tn, stride_dn,
            target_stats_ptr + b * (num_nodes + 1) * STATS,
            draft_stats_ptr + b * (num_nodes + 1) * STATS)
    step = 0
    if STEP:
        step = tree_step(b, num_nodes, vocab, paths_ptr, stride_path_b, stride_path_k,
                         stride_path_n, bias_ptr, bitmask_ptr, counts_ptr, prompt_ptr,
                         penalties_ptr, penalty_stride, STEP)
    return tree, step


@triton.jit
def node_rows(tree, step, node, vocab, STEP: tl.constexpr):
    """Node ``node``'s rows (0: the root) of a request's ``tree`` = (target row 0, draft row 0,
    their node strides, target statistics 0, draft statistics 0) and ``step`` (``tree_step``; 0
    where STEP is off): (target row, draft row, their statistics, the row's context of step 0, its
    path counted as generated)."""
    target_row0, draft_row0, stride_tn, stride_dn, target_stats0, draft_stats0 = tree
    n = node.to(tl.int64)
    p_step = 0
    if STEP:
        request, bitmask_row0, paths0, stride_k, stride_n = step
        ids0 = paths0 + n * stride_n
        before = tl.zeros([], tl.int32)
        if PENALTIES & STEP:
            before = drafts_before(ids0, stride_k, node, vocab)
        p_step = row_step(request, bitmask_row0, n, vocab, ids0, stride_k, before)
    return (target_row0 + n * stride_tn, draft_row0 + n * stride_dn, target_stats0 + n * STATS,
            draft_stats0 + n * STATS, p_step)


@triton.jit
def node_values(rows, x, LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr):
    """(p(x), q(x)) of a node's rows (``node_rows``) at token x in [0, V): two scalar gathers."""
    row_p, row_q, p_stats, q_stats, p_step = rows
    x64 = x.to(tl.int64)
    raw = tl.load(row_p + x64)
    if STEP:
        raw = adjusted_at(widen(raw), x, p_step, STEP)
    px = probabilities_at(raw, p_stats, x, True, LOGITS)
    qx = probabilities_at(tl.load(row_q + x64), q_stats, x, True, DRAFT_LOGITS)
    return px, qx


@triton.jit
def residual_pass(rows, w_row, vocab, race_slot0, stream, off_lo, off_hi, key_lo, key_hi,
                  GROUP: tl.constexpr, CHUNK: tl.constexpr, LOGITS: tl.constexpr,
                  DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr):
    """One pass over a node's row pair (``node_rows``), GROUP chunks at a time: the exact mass of
    the residual R = relu(w_row p - q) (float64, as core/sampling/sums.py's exact_total of its
    float32 chunk masses) and the best (key, chunk) of the R race and of the p race."""
    row_p, row_q, p_stats, q_stats, p_step = rows
    res_key, res_chunk, p_key, p_chunk = race_start()
    bins = tl.zeros([1, BIN_LANES], tl.int64)
    chunks = tl.cdiv(vocab, CHUNK)
    for first in range(0, chunks, GROUP):
        count = tl.minimum(chunks - first, GROUP).to(tl.int32)
        res_masses, p_masses = masses_residual(row_p, row_q, w_row, first, count, vocab, GROUP,
                                               CHUNK, LOGITS, p_stats, DRAFT_LOGITS, q_stats,
                                               STEP, p_step)
        bins = add_masses(bins, res_masses[None, :])  # slots past count hold 0
        res_key, res_chunk, p_key, p_chunk = race_group(
            res_key, res_chunk, p_key, p_chunk, res_masses, p_masses, first, count, race_slot0,
            stream, off_lo, off_hi, key_lo, key_hi, GROUP)
    return tl.sum(to_float(bins), axis=0), res_key, res_chunk, p_key, p_chunk


@triton.jit
def p_pass(rows, vocab, race_slot0, stream, off_lo, off_hi, key_lo, key_hi, GROUP: tl.constexpr,
           CHUNK: tl.constexpr, LOGITS: tl.constexpr, STEP: tl.constexpr):
    """One pass over a node's target row (``node_rows``): the best (key, chunk) of the p race."""
    row_p, row_q, p_stats, q_stats, p_step = rows
    p_key = tl.zeros([], tl.float64) + float("inf")
    p_chunk = tl.zeros([], tl.int64)
    slot = tl.arange(0, GROUP)
    chunks = tl.cdiv(vocab, CHUNK)
    for first in range(0, chunks, GROUP):
        count = tl.minimum(chunks - first, GROUP).to(tl.int32)
        p_masses = masses_p(row_p, 1.0, first, count, vocab, False, GROUP, CHUNK, LOGITS, p_stats,
                            STEP, p_step)
        u = philox_uniform(race_slot0 + first + slot, stream, off_lo, off_hi, key_lo, key_hi)
        p_key, p_chunk = keep_best(p_key, p_chunk, p_masses, first, count,
                                   -tl.log(u.to(tl.float64)), GROUP)
    return p_key, p_chunk


@triton.jit
def node_token(rows, res_key, res_chunk, p_chunk, vocab, w_row, read_q, u_cdf,
               HAS_DRAFT: tl.constexpr, CHUNK: tl.constexpr, LOGITS: tl.constexpr,
               DRAFT_LOGITS: tl.constexpr, STEP: tl.constexpr):
    """``race_token`` of a node's rows (``node_rows``)."""
    row_p, row_q, p_stats, q_stats, p_step = rows
    return race_token(row_p, row_q, res_key, res_chunk, p_chunk, vocab, w_row, read_q, -1, u_cdf,
                      HAS_DRAFT, CHUNK, LOGITS, p_stats, DRAFT_LOGITS, q_stats, STEP, p_step)


@triton.jit
def request_keys(b, seed_ptr, offset_ptr, seed_stride, offset_stride, seed_per_request):
    """(stream, offset's two words, seed's two words): the Philox inputs of request b's random
    numbers (core/sampling/philox.py)."""
    seed = tl.load(seed_ptr + b * seed_stride)
    offset = tl.load(offset_ptr + b * offset_stride)
    key_lo, key_hi = split_int64(seed)
    off_lo, off_hi = split_int64(offset)
    return tl.where(seed_per_request != 0, 0, b), off_lo, off_hi, key_lo, key_hi


@triton.jit
def read_nodes(b, ids_ptr, parents_ptr, num_nodes, vocab, stride_ib, stride_in, stride_pb,
               stride_pn, BLOCK_M: tl.constexpr):
    """Rule 1 for request b: (lane, whether lane l holds a node, the tokens, the parents), lane l
    holding node l + 1; an unlinked node (its id outside [0, V) or its parent outside [0, l]) gets
    token and parent -1, so that no later step sees it."""
    lane = tl.arange(0, BLOCK_M)
    lane64 = lane.to(tl.int64)
    is_node = lane < num_nodes
    ids = tl.load(ids_ptr + b * stride_ib + lane64 * stride_in, mask=is_node, other=-1)
    given = tl.load(parents_ptr + b * stride_pb + lane64 * stride_pn, mask=is_node, other=-1)
    ids = ids.to(tl.int64)
    given = given.to(tl.int64)
    linked = is_node & (ids >= 0) & (ids < vocab) & (given >= 0) & (given <= lane64)
    return (lane, is_node, tl.where(linked, ids, -1).to(tl.int32),
            tl.where(linked, given, -1).to(tl.int32))


@triton.jit
def pick(values, lane, l):
    """values[l] of a lane vector (exact: one nonzero term)."""
    return tl.sum(tl.where(lane == l, values, 0), axis=0)


@triton.jit(do_not_specialize=[
    # Not on the row-addressing path: out of the specialisation key, so that no value of them (a
    # stride of 1, an odd count, a pointer 8 bytes past 16-byte alignment) compiles another kernel.
    "ids_ptr", "parents_ptr", "seed_ptr", "offset_ptr", "out_tokens_ptr", "out_nodes_ptr",
    "emitted_ptr", "target_stats_ptr", "draft_stats_ptr", "paths_ptr", "stride_path_b",
    "stride_path_k", "stride_path_n", "penalties_ptr", "penalty_stride", "num_nodes", "stride_ib",
    "stride_in", "stride_pb", "stride_pn", "seed_stride", "offset_stride", "seed_per_request",
    "with_replacement", "draw_slots"])
def tree_speculative_sampling_kernel(
    target_ptr,  # (B, M + 1, V) target probabilities (LOGITS: logits), vocabulary stride 1
    draft_ptr,  # (B, M + 1, V) draft probabilities (DRAFT_LOGITS: logits), vocabulary stride 1
    # (target_ptr when None)
    ids_ptr,  # (B, M) node tokens
    parents_ptr,  # (B, M) node parents
    seed_ptr,  # (1,) or (B,) int64
    offset_ptr,  # (1,) or (B,) int64
    out_tokens_ptr,  # (B, M + 1) int32 contiguous
    out_nodes_ptr,  # (B, M) int32 contiguous
    emitted_ptr,  # (B,) int32
    target_stats_ptr,  # LOGITS: (B (M + 1), STATS) float64 statistics of the target's rows
    draft_stats_ptr,  # DRAFT_LOGITS: (B (M + 1), STATS) float64 statistics of the draft's rows
    # Rule step 0 of the target's rows (LOGITS, where STEP says; core/sampling/step_triton.py):
    paths_ptr, stride_path_b, stride_path_k, stride_path_n,  # (B, M + 1, max(M, 1)) each node's
    # path tokens counted as generated (processed.py's paths)
    bias_ptr,  # (B, V) logit bias, contiguous
    bitmask_ptr,  # (B, M + 1, ceil(V / 32)) int32, contiguous
    counts_ptr,  # (B, V) output token counts, contiguous
    prompt_ptr,  # (B, V) bool prompt token mask, contiguous
    penalties_ptr, penalty_stride,  # (1 or B, 4) float64: repetition, frequency, presence, 1/r
    num_nodes, vocab, stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,
    stride_pb, stride_pn, seed_stride, offset_stride, seed_per_request, with_replacement,
    draw_slots,  # K + 1: draw r's slots start at r (K + 1), node i's coin is K + 2i - 1 (slots.py)
    HAS_DRAFT: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr,
    LOGITS: tl.constexpr = 0,  # the rows are logits (values_triton.ONE_HOT)
    DRAFT_LOGITS: tl.constexpr = 0,
    STEP: tl.constexpr = 0,  # the parts of rule step 0 that are on (step_triton.py's flags)
):
    b = tl.program_id(0).to(tl.int64)  # 64-bit: b * stride never overflows
    stream, off_lo, off_hi, key_lo, key_hi = request_keys(b, seed_ptr, offset_ptr, seed_stride,
                                                          offset_stride, seed_per_request)
    lane, is_node, token, parent = read_nodes(b, ids_ptr, parents_ptr, num_nodes, vocab,
                                              stride_ib, stride_in, stride_pb, stride_pn,
                                              BLOCK_M)
    tree, step = request_tree(b, num_nodes, vocab, target_ptr, draft_ptr, stride_tb, stride_tn,
                              stride_db, stride_dn, target_stats_ptr, draft_stats_ptr, paths_ptr,
                              stride_path_b, stride_path_k, stride_path_n, bias_ptr, bitmask_ptr,
                              counts_ptr, prompt_ptr, penalties_ptr, penalty_stride, STEP)

    # The path is written as the walk takes it, the rest of the rows once it has stopped: every
    # output element has one store.
    out_tokens = out_tokens_ptr + b * (num_nodes + 1)
    out_nodes = out_nodes_ptr + b * num_nodes
    node = tl.zeros([], tl.int32)  # where the walk stands; 0 is the root
    depth = tl.zeros([], tl.int32)  # drafts accepted
    walking = tl.full([], 1, tl.int32)
    no_race = tl.zeros([], tl.float64) + float("inf")  # the key of a race without mass
    if HAS_DRAFT:
        rejections = tl.zeros([], tl.int32)
        weight = tl.full([], 1.0, tl.float64)
        scale = tl.full([], 1.0, tl.float64)
        mass = tl.full([], 1.0, tl.float64)
        res_key = no_race
        res_chunk = tl.zeros([], tl.int64)
        p_key = no_race
        p_chunk = tl.zeros([], tl.int64)
        while walking != 0:
            # Rules 3-5 at this node: its children judged in node order.
            children = parent == node
            rows = node_rows(tree, step, node, vocab, STEP)
            rejections = tl.zeros([], tl.int32)
            weight = tl.full([], 1.0, tl.float64)
            scale = tl.full([], 1.0, tl.float64)
            mass = tl.full([], 1.0, tl.float64)
            after = tl.full([], -1, tl.int32)
            judging = tl.full([], 1, tl.int32)
            walking = tl.zeros([], tl.int32)
            while judging != 0:
                child = tl.min(tl.where(children & (lane > after), lane, BLOCK_M), axis=0)
                judging = (child < BLOCK_M).to(tl.int32)
                if child < BLOCK_M:
                    x = pick(token, lane, child)
                    px, qx = node_values(rows, x, LOGITS, DRAFT_LOGITS, STEP)
                    earlier = children & (lane < child) & (token == x)
                    duplicate = tl.sum(earlier.to(tl.int32), axis=0) > 0
                    value = tl.where(rejections == 0, px,
                                     tl.maximum(weight.to(tl.float32) * px - qx, 0.0))
                    s = scale * mass
                    coin = philox_uniform(draw_slots + 2 * child, stream, off_lo, off_hi, key_lo,
                                          key_hi)  # node child + 1's coin (slots.py)
                    accepted = ~duplicate & ((coin * qx).to(tl.float64) * s < value.to(tl.float64))
                    if accepted:
                        tl.store(out_nodes + depth, child + 1)
                        tl.store(out_tokens + depth, x)
                        depth += 1
                        node = child + 1
                        judging = tl.zeros([], tl.int32)
                        walking = tl.full([], 1, tl.int32)
                    else:
                        # Rule 5: the next residual, relu(w p - q) with w and c in float64.
                        weight = tl.where(rejections == 0, 1.0, weight / (1.0 + s))
                        if with_replacement == 0:
                            remaining = 1.0 - scale * qx.to(tl.float64)
                            scale = tl.where(remaining > 0,
                                             scale / tl.where(remaining > 0, remaining, 1.0), 0.0)
                        rejections += 1
                        after = child
                        mass, res_key, res_chunk, p_key, p_chunk = residual_pass(
                            rows, weight.to(tl.float32), vocab, 1, stream, off_lo, off_hi,
                            key_lo, key_hi, GROUP, CHUNK, LOGITS, DRAFT_LOGITS, STEP)
                        judging = (mass > 0).to(tl.int32)  # no mass: the rest are rejected
        # Rule 6: draw 0 at the node the walk stopped at, from the last residual where it has
        # rejections and mass, else from p.
        rows = node_rows(tree, step, node, vocab, STEP)
        if rejections == 0:  # a node without children: p alone
            p_key, p_chunk = p_pass(rows, vocab, 1, stream, off_lo, off_hi, key_lo, key_hi,
                                    GROUP, CHUNK, LOGITS, STEP)  # draw 0's race slots (slots.py)
            res_key = no_race
        u_cdf = philox_uniform(0, stream, off_lo, off_hi, key_lo, key_hi)  # draw 0's
        # HAS_DRAFT & ...: a boolean, where Triton's interpreter would give a float comparison
        # the type of its operands (race_token broadcasts it into a load mask).
        read_q = HAS_DRAFT & (res_key < float("inf"))
        drawn = node_token(rows, res_key, res_chunk, p_chunk, vocab, weight.to(tl.float32),
                           read_q, u_cdf, True, CHUNK, LOGITS, DRAFT_LOGITS, STEP)
        drawn = tl.where((res_key < float("inf")) | (p_key < float("inf")), drawn, -1)
    else:
        drawn = tl.full([], -1, tl.int32)
        while walking != 0:
            # Target-only: draw r = depth from this node's target row; the first child carrying
            # the token is taken.
            rows = node_rows(tree, step, node, vocab, STEP)
            slot0 = depth * draw_slots
            p_key, p_chunk = p_pass(rows, vocab, slot0 + 1, stream, off_lo, off_hi, key_lo,
                                    key_hi, GROUP, CHUNK, LOGITS, STEP)
            u_cdf = philox_uniform(slot0, stream, off_lo, off_hi, key_lo, key_hi)
            drawn = node_token(rows, no_race, p_chunk, p_chunk, vocab, 1.0, tl.zeros([], tl.int1),
                               u_cdf, False, CHUNK, LOGITS, DRAFT_LOGITS, STEP)
            drawn = tl.where(p_key < float("inf"), drawn, -1)
            child = tl.min(tl.where((parent == node) & (token == drawn), lane, BLOCK_M), axis=0)
            if child < BLOCK_M:
                tl.store(out_nodes + depth, child + 1)
                tl.store(out_tokens + depth, drawn)
                depth += 1
                node = child + 1
            else:
                walking = tl.zeros([], tl.int32)

    # Rule 8: after the path's tokens, the drawn token, then -1; after its nodes, -1; the count.
    tl.store(out_tokens + lane, tl.where(lane == depth, drawn, -1),
             mask=(lane >= depth) & (lane <= num_nodes))
    tl.store(out_nodes + lane, tl.full([BLOCK_M], -1, tl.int32), mask=(lane >= depth) & is_node)
    tl.store(emitted_ptr + b, depth)
