"""Launching the traversal kernel: tree/launch.py's launch, one program per request's tree, as
the tree kernel is launched (the two take the same arguments)."""

from __future__ import annotations

import torch

from ...core.launch.launcher import FOUR_WARPS, TritonKernel
from ..launch import launch
from .kernel import tree_traversal_kernel

# tests/sass.py compiles the kernel with its options, read from this.
KERNEL = TritonKernel(tree_traversal_kernel, **FOUR_WARPS)


def tree_traversal_triton(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                          parents: torch.Tensor, target_probs: torch.Tensor, seed: torch.Tensor,
                          offset: torch.Tensor, with_replacement: bool = True):
    """Same contract as ``reference.verify``. No host synchronisation; the outputs are its only
    allocations (safe on concurrent streams and in CUDA graphs)."""
    return launch(KERNEL, draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                  with_replacement)
