"""The Triton kernel of traversal verification (CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``); ``launch.py`` launches it, as it launches the tree kernel. docs/internals/kernel.md ("The traversal
kernel") explains the design.

Grid (B,): program b traverses request b's tree as ``traversal_reference.py`` does, one step per loop
iteration, and reads the rows of the nodes it stands on only: judging a child takes two scalar
gathers, p(x) and q(x); each rejection is one pass over the rejecting node's row pair that forms
its next residual relu(w p - q), its exact mass and its race's best chunk (kept for the draw); a
leaf's test is one coin. The token after the kept path is one inverse CDF in the winning chunk of
the node's last residual, or of a pass over its target row where it rejected nothing. Every node's
state is a lane of six vectors (lane n for node n, the root's 0). No partials, no host
synchronisation: the outputs are the only allocations.

The algorithm is that of ``traversal_reference.py``, token for token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.sampling.philox import philox_uniform
from .kernel import (node_rows, node_token, node_values, p_pass, pick, read_nodes, request_keys,
                     request_tree, residual_pass)

HAS_DRAFT = tl.constexpr(True)  # a traversal always reads the draft's rows


@triton.jit
def _child_value(a, rejections, w, m, s, px, qx):
    """traversal_reference.child_value for one child: min(1, a B(x) / Q(x)), float64."""
    first = rejections == 0
    value = tl.where(first, px, tl.maximum(w.to(tl.float32) * px - qx, 0.0))
    num = a * value.to(tl.float64)
    den = tl.where(first, 1.0, m) * s * qx.to(tl.float64)
    return tl.where(num < den, num / tl.where(num < den, den, 1.0), tl.where(num > 0, 1.0, 0.0))


@triton.jit(do_not_specialize=[
    # Not on the row-addressing path: out of the specialisation key, so that no value of them (a
    # stride of 1, an odd count, a pointer 8 bytes past 16-byte alignment) compiles another kernel.
    "ids_ptr", "parents_ptr", "seed_ptr", "offset_ptr", "out_tokens_ptr", "out_nodes_ptr",
    "emitted_ptr", "target_stats_ptr", "draft_stats_ptr", "paths_ptr", "stride_path_b",
    "stride_path_k", "stride_path_n", "penalties_ptr", "penalty_stride", "num_nodes", "stride_ib",
    "stride_in", "stride_pb", "stride_pn", "seed_stride", "offset_stride", "seed_per_request",
    "with_replacement", "draw_slots"])
def tree_traversal_kernel(
    target_ptr,  # (B, M + 1, V) target probabilities (LOGITS: logits), vocabulary stride 1
    draft_ptr,  # (B, M + 1, V) draft probabilities (DRAFT_LOGITS: logits), vocabulary stride 1
    ids_ptr,  # (B, M) node tokens
    parents_ptr,  # (B, M) node parents
    seed_ptr,  # (1,) or (B,) int64
    offset_ptr,  # (1,) or (B,) int64
    out_tokens_ptr,  # (B, M + 1) int32 contiguous
    out_nodes_ptr,  # (B, M) int32 contiguous
    emitted_ptr,  # (B,) int32
    # Verification from logits and rule step 0, as the tree kernel takes them (kernel.py)
    target_stats_ptr, draft_stats_ptr, paths_ptr, stride_path_b, stride_path_k, stride_path_n,
    bias_ptr, bitmask_ptr, counts_ptr, prompt_ptr, penalties_ptr, penalty_stride,
    num_nodes, vocab, stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,
    stride_pb, stride_pn, seed_stride, offset_stride, seed_per_request, with_replacement,
    draw_slots,  # K + 1: draw 0's slots are 0 .. K, node i's coin is K + 2i - 1 (tree/slots.py)
    BLOCK_M: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr,
    LOGITS: tl.constexpr = 0, DRAFT_LOGITS: tl.constexpr = 0, STEP: tl.constexpr = 0,
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

    # Every node's state (traversal_reference.Nodes), lane n for node n, and its residual race's best
    # (key, chunk) from its last rejection.
    no_race = float("inf")
    value = tl.full([BLOCK_M], 1.0, tl.float64)
    rejections = tl.zeros([BLOCK_M], tl.int32)
    weight = tl.full([BLOCK_M], 1.0, tl.float64)
    mass = tl.full([BLOCK_M], 1.0, tl.float64)
    scale = tl.full([BLOCK_M], 1.0, tl.float64)
    after = tl.full([BLOCK_M], -1, tl.int32)
    race_key = tl.full([BLOCK_M], no_race, tl.float64)
    race_chunk = tl.zeros([BLOCK_M], tl.int64)

    # The path so far, position l in lane l: kept in registers and stored once at the end, so
    # that every output element has one store (a later descent rewrites a position).
    path_nodes = tl.zeros([BLOCK_M], tl.int32)
    path_tokens = tl.zeros([BLOCK_M], tl.int32)
    node = tl.zeros([], tl.int32)  # where the traversal stands; 0 is the root
    depth = tl.zeros([], tl.int32)  # the path's length
    walking = tl.full([], 1, tl.int32)
    while walking != 0:
        a = pick(value, lane, node)
        children = parent == node
        child = tl.min(tl.where(children & (lane > pick(after, lane, node)), lane, BLOCK_M),
                       axis=0)
        # A rejection updates ``upper`` for its child ``rejected`` (an index, node - 1).
        rejecting = tl.zeros([], tl.int32)
        upper = node
        rejected = child
        if (node != 0) & (tl.where(a == 0, 1, 0) != 0):  # rejected with all left below it
            rejecting = tl.full([], 1, tl.int32)
            upper = pick(parent, lane, node - 1)
            rejected = node - 1
        elif child < BLOCK_M:
            x = pick(token, lane, child)
            px, qx = node_values(node_rows(tree, step, node, vocab, STEP), x, LOGITS,
                                 DRAFT_LOGITS, STEP)
            duplicate = tl.sum((children & (lane < child) & (token == x)).to(tl.int32), axis=0) > 0
            v = _child_value(a, pick(rejections, lane, node), pick(weight, lane, node),
                             pick(mass, lane, node), pick(scale, lane, node), px, qx)
            v = tl.where(duplicate, 0.0, v)
            if v > 0:  # down to the child, fresh, with its value
                n = child + 1
                here = lane == n
                value = tl.where(here, v, value)
                rejections = tl.where(here, 0, rejections)
                weight = tl.where(here, 1.0, weight)
                mass = tl.where(here, 1.0, mass)
                scale = tl.where(here, 1.0, scale)
                after = tl.where(here, -1, after)
                path_nodes = tl.where(lane == depth, n, path_nodes)
                path_tokens = tl.where(lane == depth, x, path_tokens)
                depth += 1
                node = n
            else:  # rejected in place
                rejecting = tl.full([], 1, tl.int32)
        elif node == 0:  # every draft rejected: the root keeps nothing
            walking = tl.zeros([], tl.int32)
        else:  # a leaf: its path kept with probability a
            coin = philox_uniform(draw_slots + 2 * (node - 1), stream, off_lo, off_hi, key_lo,
                                  key_hi)  # node's coin (slots.py)
            if coin.to(tl.float64) < a:
                walking = tl.zeros([], tl.int32)
            else:
                rejecting = tl.full([], 1, tl.int32)
                upper = pick(parent, lane, node - 1)
                rejected = node - 1
        if rejecting != 0:
            here = lane == upper
            after = tl.where(here, rejected, after)
            au = pick(value, lane, upper)
            if au > 0:  # a node of value 0 is left as it is
                ku = pick(rejections, lane, upper)
                wu = pick(weight, lane, upper)
                mu = pick(mass, lane, upper)
                su = pick(scale, lane, upper)
                rows = node_rows(tree, step, upper, vocab, STEP)
                px, qx = node_values(rows, pick(token, lane, rejected), LOGITS, DRAFT_LOGITS,
                                     STEP)
                first = ku == 0
                w_new = tl.where(first, au, au * wu / (au + su * mu))
                m_new, key, chunk, p_key, p_chunk = residual_pass(
                    rows, w_new.to(tl.float32), vocab, 1, stream, off_lo, off_hi, key_lo, key_hi,
                    GROUP, CHUNK, LOGITS, DRAFT_LOGITS, STEP)  # draw 0's race slots (slots.py)
                total = tl.where(first, su, au / tl.where(first, 1.0, mu) + su) * m_new
                den = total + (1.0 - au)
                a_new = tl.where(den > 0, total / tl.where(den > 0, den, 1.0), 0.0)
                s_new = su
                if with_replacement == 0:  # Q drops the rejected token
                    remaining = 1.0 - su * qx.to(tl.float64)
                    s_new = tl.where(remaining > 0,
                                     su / tl.where(remaining > 0, remaining, 1.0), 0.0)
                value = tl.where(here, a_new, value)
                rejections = tl.where(here, ku + 1, rejections)
                weight = tl.where(here, w_new, weight)
                mass = tl.where(here, m_new, mass)
                scale = tl.where(here, s_new, scale)
                race_key = tl.where(here, key, race_key)
                race_chunk = tl.where(here, chunk, race_chunk)
            if upper != node:  # this node was rejected: back up to its parent
                depth -= 1
                node = upper

    # The token after the path: drawn from the node's last residual where it has rejections and
    # mass, else from p there.
    rows = node_rows(tree, step, node, vocab, STEP)
    use_residual = (pick(rejections, lane, node) > 0) & (tl.where(pick(mass, lane, node) > 0, 1, 0)
                                                         != 0)
    res_key = tl.where(use_residual, pick(race_key, lane, node), no_race)
    res_chunk = pick(race_chunk, lane, node)
    p_key = tl.zeros([], tl.float64) + no_race
    p_chunk = tl.zeros([], tl.int64)
    if use_residual == 0:
        p_key, p_chunk = p_pass(rows, vocab, 1, stream, off_lo, off_hi, key_lo, key_hi, GROUP,
                                CHUNK, LOGITS, STEP)  # draw 0's race slots (slots.py)
    u_cdf = philox_uniform(0, stream, off_lo, off_hi, key_lo, key_hi)  # draw 0's
    # HAS_DRAFT & ...: a boolean, where Triton's interpreter would give a float comparison the
    # type of its operands (race_token broadcasts it into a load mask).
    read_q = HAS_DRAFT & (res_key < float("inf"))
    drawn = node_token(rows, res_key, res_chunk, p_chunk, vocab,
                       pick(weight, lane, node).to(tl.float32), read_q, u_cdf, True, CHUNK,
                       LOGITS, DRAFT_LOGITS, STEP)
    drawn = tl.where((res_key < float("inf")) | (p_key < float("inf")), drawn, -1)

    # Rule 8: the path's tokens, the drawn token, then -1; its nodes, then -1; the count.
    tokens = tl.where(lane < depth, path_tokens, tl.where(lane == depth, drawn, -1))
    tl.store(out_tokens_ptr + b * (num_nodes + 1) + lane, tokens, mask=lane <= num_nodes)
    tl.store(out_nodes_ptr + b * num_nodes + lane, tl.where(lane < depth, path_nodes, -1),
             mask=is_node)
    tl.store(emitted_ptr + b, depth)
