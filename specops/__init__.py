"""specops: speculative-decoding sampling ops for PyTorch.

``specops.chain_speculative_sampling`` is the FlashInfer-compatible API;
``torch.ops.specops.chain_speculative_sampling`` is the registered op it calls.
``specops.tree_speculative_sampling`` verifies a tree of drafts (docs/tree.md, "Tree
verification").
``specops.warmup`` loads every kernel a decode loop can launch before the loop starts.
Layout: ``core/`` holds what every sampler shares, each sampler has its own package (``chain/``
token and block verification, ``tree/`` tree verification); docs/internals/contributing.md has the map.
"""

from .api import (chain_speculative_sampling, chain_speculative_sampling_from_logits,
                  tree_speculative_sampling, tree_speculative_sampling_from_logits)
from .warmup import warmup
from .core.sampling.race import CHUNK_SIZE

__all__ = ["chain_speculative_sampling", "chain_speculative_sampling_from_logits",
           "tree_speculative_sampling", "tree_speculative_sampling_from_logits", "warmup",
           "CHUNK_SIZE"]
__version__ = "0.1.0"
