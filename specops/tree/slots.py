"""Which Philox slot each random number of one tree request uses (docs/internals/randomness.md, "Slots of
a tree request").

M nodes (node i = 1..M; node 0 is the root), K = ceil(V / CHUNK_SIZE) vocabulary chunks; a call
draws tokens by the chunked race in numbered draws r = 0, 1, ..., each with its own block of
K + 1 slots:
    slot i - 1,                     1 <= i <= M : the acceptance coin of node i (draft
                                                  probabilities given)
    slot M + r (K + 1),             0 <= r <= M : the inverse-CDF uniform of draw r
    slot M + r (K + 1) + 1 + k,     k < K       : the race uniform of chunk k in draw r
With draft probabilities a call makes one draw (r = 0), at the node where the walk stops: the
chain op's slots, so that a chain of nodes gives the chain op's tokens. Target-only, draw r is
the one at depth r of the path (the root's is r = 0), so the draws along a path never share a
uniform.
"""

from __future__ import annotations

from ..core.sampling.race import num_chunks


def coin_slot(node: int) -> int:
    return node - 1


def draw_slot(num_nodes: int, vocab: int, draw: int) -> int:
    """The inverse-CDF uniform's slot of draw ``draw``; its race slots follow it."""
    return num_nodes + draw * (num_chunks(vocab) + 1)


def race_slot(num_nodes: int, vocab: int, draw: int, chunk: int) -> int:
    return draw_slot(num_nodes, vocab, draw) + 1 + chunk


def slots_per_draw(vocab: int) -> int:
    return num_chunks(vocab) + 1
