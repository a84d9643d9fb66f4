"""specops: speculative-decoding sampling ops for PyTorch.

``specops.chain_speculative_sampling`` is the FlashInfer-compatible API;
``torch.ops.specops.chain_speculative_sampling`` is the registered op it calls.
"""

from .api import chain_speculative_sampling
from .randomness import CHUNK_SIZE

__all__ = ["chain_speculative_sampling", "CHUNK_SIZE"]
__version__ = "0.1.0"
