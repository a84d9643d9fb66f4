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
from ..core.sampling.probs_triton import sanitize
from ..core.sampling.race_triton import (keep_best, masses_p, masses_residual, race_group,
                                         race_start, race_token)
from ..core.sampling.sums_triton import BIN_LANES, add_masses, to_float


@triton.jit
def residual_pass(row_p, row_q, w_row, vocab, race_slot0, stream, off_lo, off_hi, key_lo, key_hi,
                   GROUP: tl.constexpr, CHUNK: tl.constexpr):
    """One pass over a node's row pair, GROUP chunks at a time: the exact mass of the residual
    R = relu(w_row p - q) (float64, as core/sampling/sums.py's exact_total of its float32 chunk masses) and
    the best (key, chunk) of the R race and of the p race."""
    res_key, res_chunk, p_key, p_chunk = race_start()
    bins = tl.zeros([1, BIN_LANES], tl.int64)
    chunks = tl.cdiv(vocab, CHUNK)
    for first in range(0, chunks, GROUP):
        count = tl.minimum(chunks - first, GROUP).to(tl.int32)
        res_masses, p_masses = masses_residual(row_p, row_q, w_row, first, count, vocab, GROUP,
                                               CHUNK)
        bins = add_masses(bins, res_masses[None, :])  # slots past count hold 0
        res_key, res_chunk, p_key, p_chunk = race_group(
            res_key, res_chunk, p_key, p_chunk, res_masses, p_masses, first, count, race_slot0,
            stream, off_lo, off_hi, key_lo, key_hi, GROUP)
    return tl.sum(to_float(bins), axis=0), res_key, res_chunk, p_key, p_chunk


@triton.jit
def p_pass(row_p, vocab, race_slot0, stream, off_lo, off_hi, key_lo, key_hi,
            GROUP: tl.constexpr, CHUNK: tl.constexpr):
    """One pass over a node's target row: the best (key, chunk) of the p race."""
    p_key = tl.zeros([], tl.float64) + float("inf")
    p_chunk = tl.zeros([], tl.int64)
    slot = tl.arange(0, GROUP)
    chunks = tl.cdiv(vocab, CHUNK)
    for first in range(0, chunks, GROUP):
        count = tl.minimum(chunks - first, GROUP).to(tl.int32)
        p_masses = masses_p(row_p, 1.0, first, count, vocab, False, GROUP, CHUNK)
        u = philox_uniform(race_slot0 + first + slot, stream, off_lo, off_hi, key_lo, key_hi)
        p_key, p_chunk = keep_best(p_key, p_chunk, p_masses, first, count,
                                   -tl.log(u.to(tl.float64)), GROUP)
    return p_key, p_chunk


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
    "emitted_ptr", "num_nodes", "stride_ib", "stride_in", "stride_pb", "stride_pn",
    "seed_stride", "offset_stride", "seed_per_request", "with_replacement", "draw_slots"])
def tree_speculative_sampling_kernel(
    target_ptr,  # (B, M + 1, V) target probabilities, vocabulary stride 1
    draft_ptr,  # (B, M + 1, V) draft probabilities, vocabulary stride 1 (target_ptr when None)
    ids_ptr,  # (B, M) node tokens
    parents_ptr,  # (B, M) node parents
    seed_ptr,  # (1,) or (B,) int64
    offset_ptr,  # (1,) or (B,) int64
    out_tokens_ptr,  # (B, M + 1) int32 contiguous
    out_nodes_ptr,  # (B, M) int32 contiguous
    emitted_ptr,  # (B,) int32
    num_nodes, vocab, stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,
    stride_pb, stride_pn, seed_stride, offset_stride, seed_per_request, with_replacement,
    draw_slots,  # K + 1: draw r's slots start at r (K + 1), node i's coin is K + 2i - 1 (slots.py)
    HAS_DRAFT: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # 64-bit: b * stride never overflows
    stream, off_lo, off_hi, key_lo, key_hi = request_keys(b, seed_ptr, offset_ptr, seed_stride,
                                                          offset_stride, seed_per_request)
    lane, is_node, token, parent = read_nodes(b, ids_ptr, parents_ptr, num_nodes, vocab,
                                              stride_ib, stride_in, stride_pb, stride_pn,
                                              BLOCK_M)

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
            row_p = target_ptr + b * stride_tb + node.to(tl.int64) * stride_tn
            row_q = draft_ptr + b * stride_db + node.to(tl.int64) * stride_dn
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
                    px = sanitize(tl.load(row_p + x.to(tl.int64)))
                    qx = sanitize(tl.load(row_q + x.to(tl.int64)))
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
                            row_p, row_q, weight.to(tl.float32), vocab, 1, stream,
                            off_lo, off_hi, key_lo, key_hi, GROUP, CHUNK)
                        judging = (mass > 0).to(tl.int32)  # no mass: the rest are rejected
        # Rule 6: draw 0 at the node the walk stopped at, from the last residual where it has
        # rejections and mass, else from p.
        row_p = target_ptr + b * stride_tb + node.to(tl.int64) * stride_tn
        row_q = draft_ptr + b * stride_db + node.to(tl.int64) * stride_dn
        if rejections == 0:  # a node without children: p alone
            p_key, p_chunk = p_pass(row_p, vocab, 1, stream, off_lo, off_hi, key_lo,
                                     key_hi, GROUP, CHUNK)  # draw 0's race slots (slots.py)
            res_key = no_race
        u_cdf = philox_uniform(0, stream, off_lo, off_hi, key_lo, key_hi)  # draw 0's
        # HAS_DRAFT & ...: a boolean, where Triton's interpreter would give a float comparison
        # the type of its operands (race_token broadcasts it into a load mask).
        read_q = HAS_DRAFT & (res_key < float("inf"))
        drawn = race_token(row_p, row_q, res_key, res_chunk, p_chunk, vocab,
                           weight.to(tl.float32), read_q, -1, u_cdf, True, CHUNK)
        drawn = tl.where((res_key < float("inf")) | (p_key < float("inf")), drawn, -1)
    else:
        drawn = tl.full([], -1, tl.int32)
        while walking != 0:
            # Target-only: draw r = depth from this node's target row; the first child carrying
            # the token is taken.
            row_p = target_ptr + b * stride_tb + node.to(tl.int64) * stride_tn
            slot0 = depth * draw_slots
            p_key, p_chunk = p_pass(row_p, vocab, slot0 + 1, stream, off_lo, off_hi, key_lo,
                                     key_hi, GROUP, CHUNK)
            u_cdf = philox_uniform(slot0, stream, off_lo, off_hi, key_lo, key_hi)
            drawn = race_token(row_p, row_p, no_race, p_chunk, p_chunk, vocab, 1.0,
                               tl.zeros([], tl.int1), -1, u_cdf, False, CHUNK)
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
