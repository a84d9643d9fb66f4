"""Verification on a flattened (varlen) batch, as vLLM and TensorRT-LLM keep one: every request's
drafts in one tensor with cumulative counts, the target's rows stacked (docs/api.md, "Flattened
batches"). Request b gets exactly the tokens and counts the padded functions give it; the Triton
kernels read the rows where they are, with no padded copy.

Layout: ``api.py`` the public functions; ``arguments.py`` their checks and the ops' schemas;
``layout.py`` the padded batch a layout stands for (the specification); ``op.py`` the ops.
"""

from .api import chain_speculative_sampling, chain_speculative_sampling_from_logits

__all__ = ["chain_speculative_sampling", "chain_speculative_sampling_from_logits"]
