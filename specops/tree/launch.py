"""Launching the tree kernel, and the traversal kernel for traversal verification with draft
probabilities: the three outputs, then one ``kernel[grid]`` launch of grid (B,). One program walks
one request's tree, so there is no launch plan to make and no partials to
combine (docs/internals/performance.md, "Tree verification", says why)."""

from __future__ import annotations

import functools

import torch

from ..core.launch.launcher import FOUR_WARPS, TritonKernel
from ..core.sampling.race import CHUNK_SIZE
from ..core.logits.launch import processed_rows, step_arguments
from . import slots
from .kernel import tree_speculative_sampling_kernel
from .traversal_kernel import tree_traversal_kernel
from .processed import on_processed_rows

# Chunks whose masses a program holds at once (one float32 per thread and race at 4 warps).
GROUP = 128
# tests/sass.py compiles the kernels with their options, read from these.
KERNEL = TritonKernel(tree_speculative_sampling_kernel, **FOUR_WARPS)
TRAVERSAL = TritonKernel(tree_traversal_kernel, **FOUR_WARPS)


def block_m(num_nodes: int) -> int:
    """Lanes of the node vectors: the M nodes and the M + 1 output positions, at least 16."""
    return max(16, 1 << num_nodes.bit_length())  # the next power of 2 above M


def tree_speculative_sampling_triton(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    target_probs: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    with_replacement: bool = True,
    verification: str = "token",
):
    """Same contract as ``reference.tree_speculative_sampling_reference``. No host
    synchronisation; the outputs are its only allocations (safe on concurrent streams and in CUDA
    graphs)."""
    if verification == "traversal" and draft_probs is not None:
        return tree_traversal_triton(draft_probs, draft_token_ids, parents, target_probs, seed,
                                     offset, with_replacement)
    return launch(KERNEL, draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                  with_replacement, HAS_DRAFT=draft_probs is not None)


def launch(kernel: TritonKernel, draft_probs, draft_token_ids, parents, target_probs, seed,
           offset, with_replacement, **constexprs):
    """The three outputs, then one launch of grid (B,) of ``kernel``: the tree kernel, or the
    traversal kernel (traversal_kernel.py), which take the same arguments."""
    batch, num_nodes = draft_token_ids.shape
    vocab = target_probs.shape[2]
    device = target_probs.device
    if target_probs.stride(2) != 1:  # the row passes need unit vocabulary stride (16-byte loads)
        target_probs = target_probs.contiguous()
    if draft_probs is not None and draft_probs.stride(2) != 1:
        draft_probs = draft_probs.contiguous()
    out_tokens = torch.empty((batch, num_nodes + 1), dtype=torch.int32, device=device)
    out_nodes = torch.empty((batch, num_nodes), dtype=torch.int32, device=device)
    emitted = torch.empty((batch,), dtype=torch.int32, device=device)
    if batch == 0:
        return out_tokens, out_nodes, emitted
    draft = target_probs if draft_probs is None else draft_probs  # None: never read
    stride_tb, stride_tn, _ = target_probs.stride()
    stride_db, stride_dn = draft.stride()[:2]
    stride_ib, stride_in = draft_token_ids.stride()
    stride_pb, stride_pn = parents.stride()
    seed_stride = 0 if seed.numel() == 1 else seed.stride(0)
    offset_stride = 0 if offset.numel() == 1 else offset.stride(0)
    kernel.fn[(batch,)](
        target_probs, draft, draft_token_ids, parents, seed, offset, out_tokens, out_nodes,
        emitted, num_nodes, vocab, stride_tb, stride_tn, stride_db, stride_dn, stride_ib,
        stride_in, stride_pb, stride_pn, seed_stride, offset_stride, int(seed.numel() != 1),
        int(with_replacement), slots.slots_per_draw(vocab), BLOCK_M=block_m(num_nodes),
        GROUP=GROUP, CHUNK=CHUNK_SIZE, **constexprs, **kernel.options)
    return out_tokens, out_nodes, emitted


def tree_traversal_triton(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                          with_replacement=True):
    """Traversal verification with draft probabilities: the same contract as
    ``traversal_reference.verify``, launched as the tree kernel is."""
    return launch(TRAVERSAL, draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                  with_replacement)


def paths(draft_token_ids: torch.Tensor, parents: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, M + 1, max(M, 1)) int64: row n + 1 lists the tokens in [0, V) on the path from the root
    to node n, n's own included (row 0, the root's, none), then -1: what each row counts as
    generated (``processed.tree_generated``), as the kernels of rule step 0 read it (a list up to
    its first id outside [0, V)). A node's path is at most n + 1 long: its ancestors come before
    it. A fixed number of torch operations (log2 M pointer-jumping steps), no host
    synchronisation."""
    ids, given = draft_token_ids.long(), parents.long()
    batch, num_nodes = ids.shape
    device = ids.device
    if num_nodes == 0:
        return torch.full((batch, 1, 1), -1, dtype=torch.int64, device=device)
    rows = num_nodes + 1
    node = torch.arange(num_nodes, device=device)
    # Each row's parent row, the root its own: node i (row i + 1) under row given_i in [0, i].
    up = torch.cat([torch.zeros((batch, 1), dtype=torch.int64, device=device),
                    torch.minimum(given.clamp(min=0), node).expand(batch, num_nodes)], dim=1)
    # on_path[b, n, r]: row r is row n or one of its ancestors. After s steps it holds the 2^s
    # nearest (up: the 2^s-th ancestor), all of them once 2^s >= M + 1.
    on_path = torch.eye(rows, dtype=torch.bool, device=device).expand(batch, rows, rows)
    for _ in range(num_nodes.bit_length()):
        on_path = on_path | on_path.gather(1, up[:, :, None].expand(batch, rows, rows))
        up = up.gather(1, up)
    counted = on_path[:, :, 1:] & ((ids >= 0) & (ids < vocab))[:, None, :]  # (B, M + 1, M)
    # The counted nodes first, in node order (every node's ancestors come before it).
    order = torch.where(counted, node, num_nodes).sort(dim=-1).values
    tokens = ids.gather(1, order.clamp(max=num_nodes - 1).view(batch, -1)).view(order.shape)
    return torch.where(order < num_nodes, tokens, -1)


def processed_with_step(step, draft_token_ids, parents, vocab):
    """``processed_rows`` of a tree's target rows with rule step 0 applied as they are read, each
    node's path counted as generated (``paths``; without penalties nothing counts, and the ids
    are passed as they are, never read): no adjusted rows are written."""
    counted = (draft_token_ids if step.penalties() is None else
               paths(draft_token_ids, parents, vocab))
    arguments = step_arguments(step, counted, draft_token_ids.device, draft_token_ids.shape[1])
    return functools.partial(processed_rows, step=arguments)


# Verification from logits: the rows' statistics, a pass that writes the processed rows (the tree
# kernel reads probabilities), then the above.
tree_speculative_sampling_from_logits_triton = on_processed_rows(
    tree_speculative_sampling_triton, processed_rows, processed_with_step)
