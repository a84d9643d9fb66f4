"""Vocabulary-parallel verification: each tensor-parallel rank passes its shard of the
vocabulary, the ranks exchange O(B * (N + 1)) partial results, never the (B, N + 1, V) rows, and
every rank returns the tokens the single-device call gives (docs/api.md, "Vocabulary-parallel
verification"; docs/semantics.md says when they are bit for bit the same).

Layout: ``api.py`` the public functions; ``comm.py`` the collectives and the layout exchange;
``shards.py`` values at the draft ids, the race and exact masses of a shard; ``verify.py`` token
and block verification of shards; ``logits.py`` the from-logits rule on shards.
"""

from .api import chain_speculative_sampling, chain_speculative_sampling_from_logits

__all__ = ["chain_speculative_sampling", "chain_speculative_sampling_from_logits"]
