"""Which Philox slot each random number of one request uses: the layout every sampler shares
(docs/internals/randomness.md, "Slots of one request").

N draft positions, K = ceil(V / CHUNK_SIZE) vocabulary chunks:
    slot 0                    : the inverse-CDF uniform inside the winning chunk
    slot 1 + k,       k < K   : the exponential-race uniform of chunk k
    slot 1 + K + 2j,  j < N   : the acceptance coin of draft position j
    slot 2 + K + 2j           : block verification's stop coin after j + 1 drafts (unused by
                                token verification)
    slot 2**30 + s            : vocabulary-parallel only: the race uniform of a piece of a chunk
                                that starts at global column s inside the chunk
No slot depends on N, so a request padded to more positions draws the same numbers for its own
(width invariance); the coins come last because only they grow with N. A sampler's own slots.py
adds what it alone uses.
"""

from __future__ import annotations

from .race import num_chunks

CDF_SLOT = 0


def race_slot(chunk):
    return 1 + chunk


def coin_slot(vocab: int, position: int) -> int:
    return 1 + num_chunks(vocab) + 2 * position


def num_slots(num_draft: int, vocab: int) -> int:
    """Slots 0 .. num_slots - 1 hold every number a request of N positions uses."""
    return coin_slot(vocab, num_draft)


def coin_slots(vocab: int, num_draft: int) -> slice:
    """The coins of positions 0..N-1, as a slice of a request's uniforms."""
    return slice(coin_slot(vocab, 0), coin_slot(vocab, num_draft), 2)


def race_slots(vocab: int) -> slice:
    """The race uniforms of chunks 0..K-1, as a slice of a request's uniforms."""
    return slice(race_slot(0), race_slot(num_chunks(vocab)))


# Far above every other slot of a request (coins of up to 2**29 positions), so that no layout of
# shards shares a slot with the rest.
FIRST_PIECE_SLOT = 2**30


def piece_slot(column):
    return FIRST_PIECE_SLOT + column
