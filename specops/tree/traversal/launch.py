"""Launching the traversal kernel: the three outputs, then one ``kernel[grid]`` launch of grid
(B,), one program per request's tree, as the tree kernel is launched (tree/launch.py)."""

from __future__ import annotations

import torch

from ...core.launch.launcher import FOUR_WARPS, TritonKernel
from ...core.sampling.race import CHUNK_SIZE
from .. import slots
from ..launch import GROUP, block_m
from .kernel import tree_traversal_kernel

# tests/sass.py compiles the kernel with its options, read from this.
KERNEL = TritonKernel(tree_traversal_kernel, **FOUR_WARPS)


def tree_traversal_triton(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                          parents: torch.Tensor, target_probs: torch.Tensor, seed: torch.Tensor,
                          offset: torch.Tensor, with_replacement: bool = True):
    """Same contract as ``reference.verify``. No host synchronisation; the outputs are its only
    allocations (safe on concurrent streams and in CUDA graphs)."""
    batch, num_nodes = draft_token_ids.shape
    vocab = target_probs.shape[2]
    device = target_probs.device
    if target_probs.stride(2) != 1:  # the row passes need unit vocabulary stride (16-byte loads)
        target_probs = target_probs.contiguous()
    if draft_probs.stride(2) != 1:
        draft_probs = draft_probs.contiguous()
    out_tokens = torch.empty((batch, num_nodes + 1), dtype=torch.int32, device=device)
    out_nodes = torch.empty((batch, num_nodes), dtype=torch.int32, device=device)
    emitted = torch.empty((batch,), dtype=torch.int32, device=device)
    if batch == 0:
        return out_tokens, out_nodes, emitted
    stride_tb, stride_tn, _ = target_probs.stride()
    stride_db, stride_dn, _ = draft_probs.stride()
    stride_ib, stride_in = draft_token_ids.stride()
    stride_pb, stride_pn = parents.stride()
    seed_stride = 0 if seed.numel() == 1 else seed.stride(0)
    offset_stride = 0 if offset.numel() == 1 else offset.stride(0)
    KERNEL.fn[(batch,)](
        target_probs, draft_probs, draft_token_ids, parents, seed, offset, out_tokens, out_nodes,
        emitted, num_nodes, vocab, stride_tb, stride_tn, stride_db, stride_dn, stride_ib,
        stride_in, stride_pb, stride_pn, seed_stride, offset_stride, int(seed.numel() != 1),
        int(with_replacement), slots.slots_per_draw(vocab), BLOCK_M=block_m(num_nodes),
        GROUP=GROUP, CHUNK=CHUNK_SIZE, **KERNEL.options)
    return out_tokens, out_nodes, emitted
