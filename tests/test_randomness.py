"""The randomness contract (specops/core/sampling/randomness.py, its Triton twin
specops/core/sampling/philox.py, docs/internals/randomness.md): Philox4x32-10 bit for bit, uniforms
in the open interval (0, 1), and the slot/stream layout the sampler uses."""

from __future__ import annotations

import math

import pytest
import torch

import specops
from specops.core.sampling import randomness as R

MASK = 0xFFFFFFFF


def philox_python(counter, key):
    """Philox4x32-10 on Python ints: an independent, obviously-correct model of the algorithm."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return c0, c1, c2, c3


def philox_torch(counter, key):
    words = R.philox4x32(
        tuple(torch.tensor(c, dtype=torch.int64) for c in counter),
        tuple(torch.tensor(k, dtype=torch.int64) for k in key),
    )
    return tuple(int(w) for w in words)


# Known-answer vectors of Random123 (kat_vectors, philox4x32 with 10 rounds).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK,) * 4, (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    assert philox_torch(counter, key) == expected
    assert philox_python(counter, key) == expected


def test_philox_matches_python_model_on_random_words():
    # Random 32-bit words, including the extremes, through the broadcasting int64 implementation.
    g = torch.Generator().manual_seed(0)
    n = 2000
    words = torch.randint(0, 2**32, (6, n), generator=g, dtype=torch.int64)
    words[:, :4] = torch.tensor([[0], [MASK], [1], [MASK - 1]]).T.expand(6, 4)
    out = R.philox4x32(tuple(words[:4]), tuple(words[4:]))
    for w in out:
        assert w.dtype == torch.int64 and bool(((w >= 0) & (w <= MASK)).all())
    for i in range(0, n, 37):
        counter = tuple(int(words[r, i]) for r in range(4))
        key = (int(words[4, i]), int(words[5, i]))
        assert tuple(int(w[i]) for w in out) == philox_python(counter, key)


def to_uniform_model(word: int) -> float:
    return ((word >> 9) * 2 + 1) * 2.0**-24


def test_uint32_to_uniform_open_interval_and_exact():
    words = torch.tensor([0, 1, 511, 512, 2**31, MASK - 512, MASK], dtype=torch.int64)
    u = R.uint32_to_uniform(words)
    assert u.dtype == torch.float32
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert float(u[0]) == 2.0**-24 and float(u[-1]) == 1.0 - 2.0**-24
    assert [float(x) for x in u] == [to_uniform_model(int(w)) for w in words]


def test_request_uniforms_are_uniform():
    # 256 requests x 1000 slots from one seed: strictly inside (0, 1) and uniform (chi-square on
    # 50 bins, mean, and no repeated values beyond birthday-level collisions).
    u = R.request_uniforms(torch.tensor([123]), torch.tensor([0]), 256, 1000).double()
    assert u.shape == (256, 1000)
    assert float(u.min()) > 0 and float(u.max()) < 1
    n = u.numel()
    counts = torch.histc(u, bins=50, min=0, max=1)
    stat = ((counts - n / 50) ** 2 / (n / 50)).sum()
    pvalue = float(torch.special.gammaincc(torch.tensor(49 / 2, dtype=torch.float64), stat / 2))
    assert pvalue > 1e-4, pvalue
    assert abs(float(u.mean()) - 0.5) < 4.5 * math.sqrt(1 / 12 / n)
    # 23-bit resolution: 256000 draws from 2**23 values collide ~3900 times; far more is a bug.
    assert torch.unique(u).numel() > n - 6000
    # Adjacent slots are not correlated.
    corr = torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1]
    assert abs(float(corr)) < 4.5 / math.sqrt(n)


def expected_uniform(seed: int, offset: int, stream: int, slot: int) -> float:
    seed &= 2**64 - 1
    offset &= 2**64 - 1
    word = philox_python(
        (slot, stream, offset & MASK, offset >> 32), (seed & MASK, seed >> 32)
    )[0]
    return to_uniform_model(word)


@pytest.mark.parametrize(
    "seed,offset",
    [(0, 0), (42, 7), (-1, 0), (-(2**63), 2**40 + 5), (2**63 - 1, 2**63 - 1), (-12345, -1)],
)
def test_slot_layout_single_seed(seed, offset):
    # One seed for the batch: key = seed's two words, counter = (slot, row, offset lo, offset hi).
    batch, slots = 3, 5
    u = R.request_uniforms(torch.tensor([seed]), torch.tensor([offset]), batch, slots)
    for b in range(batch):
        for s in range(slots):
            assert float(u[b, s]) == expected_uniform(seed, offset, stream=b, slot=s)


def test_slot_layout_per_request_seeds():
    # One seed per request: stream 0, so a request's numbers depend on its seed and offset only.
    seeds = torch.tensor([5, -7, 5, 2**62])
    offsets = torch.tensor([0, 3, 0, 2**33])
    u = R.request_uniforms(seeds, offsets, 4, 6)
    for b in range(4):
        for s in range(6):
            assert float(u[b, s]) == expected_uniform(int(seeds[b]), int(offsets[b]), 0, s)
    assert torch.equal(u[0], u[2])
    # A single offset with per-request seeds is broadcast.
    u1 = R.request_uniforms(seeds, torch.tensor([9]), 4, 2)
    assert float(u1[1, 1]) == expected_uniform(-7, 9, 0, 1)



def test_a_slot_range_is_the_same_slots_of_the_full_layout():
    # first_slot selects slots first_slot.. of the same layout (a tree draw's block of slots).
    seeds, offsets = torch.tensor([5, -7, 2**62]), torch.tensor([3])
    full = R.request_uniforms(seeds, offsets, 3, 40)
    assert torch.equal(R.request_uniforms(seeds, offsets, 3, 9, first_slot=31), full[:, 31:])
    assert float(R.request_uniforms(seeds, offsets, 3, 1, first_slot=2**31)[1, 0]) == \
        expected_uniform(-7, 3, 0, 2**31)

def test_slot_helpers():
    from specops.chain.token import slots
    from specops.core.sampling import race

    assert race.CHUNK_SIZE == specops.CHUNK_SIZE == 1024
    assert [race.num_chunks(v) for v in (1, 1024, 1025, 50000)] == [1, 1, 2, 49]
    # V = 1025: K = 2 chunks. Slot 0 the inverse-CDF uniform, 1 + k the races, 1 + K + 2j the
    # coins; nothing depends on N but how many coins there are.
    assert slots.CDF_SLOT == 0
    assert slots.race_slot(0) == 1 and slots.race_slot(7) == 8
    assert [slots.coin_slot(1025, j) for j in range(3)] == [3, 5, 7]
    assert slots.num_slots(4, 1025) == 11 and slots.num_slots(0, 1025) == 3
    assert list(range(11))[slots.coin_slots(1025, 4)] == [3, 5, 7, 9]
    assert list(range(11))[slots.race_slots(1025)] == [1, 2]


def test_wrapper_seed_int_forms():
    # A uint64 seed keeps its bits: 2**64 - 1 is the same key as -1.
    p = torch.full((4, 3, 50), 1 / 50)
    q = torch.full((4, 2, 50), 1 / 40)
    d = torch.zeros(4, 2, dtype=torch.int64)
    a = specops.chain_speculative_sampling(q, d, p, seed=2**64 - 1, offset=3)[0]
    b = specops.chain_speculative_sampling(q, d, p, seed=-1, offset=3)[0]
    c = specops.chain_speculative_sampling(q, d, p, seed=torch.tensor([-1]), offset=torch.tensor(3))[0]
    assert torch.equal(a, b) and torch.equal(a, c)
    with pytest.raises(ValueError, match="seed"):
        specops.chain_speculative_sampling(q, d, p, seed=2**64)
    with pytest.raises(TypeError, match="seed"):
        specops.chain_speculative_sampling(q, d, p, seed=1.5)


def test_sampler_uses_documented_slots():
    # Recompute one call's decisions from the documented layout with the Python Philox model:
    # slot 0 the in-chunk inverse-CDF uniform, slot 1+k the race uniform of chunk k, slot
    # 1+K+2j position j's coin.  V spans K = 3 chunks (the last one partial).
    batch, num_draft, vocab = 24, 2, 2 * 1024 + 300
    g = torch.Generator().manual_seed(1)
    p = torch.rand(batch, num_draft + 1, vocab, generator=g) ** 4
    q = torch.rand(batch, num_draft, vocab, generator=g) ** 4
    d = torch.randint(0, vocab, (batch, num_draft), generator=g)
    # Make acceptance a real coin flip: p(d) = q(d) * r with r in (0, 1) at position 0.
    p[torch.arange(batch), 0, d[:, 0]] = q[torch.arange(batch), 0, d[:, 0]] * 0.5
    seed, offset = 77, 5
    out, accepted, emitted = specops.chain_speculative_sampling(q, d, p, seed=seed, offset=offset)
    assert 0 < int((emitted < num_draft).sum()) < batch  # both residual and bonus rows occur
    chunks_hit = set()
    for b in range(batch):
        u = [expected_uniform(seed, offset, b, s) for s in range(1 + 3 + 2 * num_draft)]
        acc = [u[4 + 2 * j] * float(q[b, j, d[b, j]]) < float(p[b, j, d[b, j]])
               for j in range(num_draft)]
        assert int(accepted[b]) == sum(acc)
        e = acc.index(False) if False in acc else num_draft
        assert int(emitted[b]) == e
        row = p[b, e]
        if e < num_draft:
            row = (row - q[b, e]).clamp_min(0)  # float32, as semantics step 5 computes it
        # The race compares float32 chunk masses; the in-chunk threshold is u times the chunk's
        # float64 total.
        chunks = [row[k * 1024 : (k + 1) * 1024] for k in range(3)]
        masses = [float(c.sum()) for c in chunks]
        keys = [-math.log(u[1 + k]) / m if m > 0 else math.inf for k, m in enumerate(masses)]
        k = keys.index(min(keys))
        cdf = chunks[k].double().cumsum(0)
        token = k * 1024 + int(torch.nonzero(cdf > u[0] * cdf[-1])[0])
        assert int(out[b, e]) == token, (b, e)
        chunks_hit.add(k)
    assert chunks_hit == {0, 1, 2}


# ----------------------------------------------------------------------------------------------
# The fast variants: request_uniforms_fast (fewer torch operations) and request_uniforms_host (one
# request, on Python ints) give request_uniforms' numbers bit for bit.

EXTREMES = [0, 1, -1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), -(2**32), 0x9E3779B9]


def random_int64(g: torch.Generator, n: int) -> torch.Tensor:
    values = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    extremes = torch.tensor(EXTREMES, dtype=torch.int64)
    return torch.cat([extremes[torch.randint(0, len(EXTREMES), (n // 4,), generator=g)],
                      values])[torch.randperm(n + n // 4, generator=g)][:n]


@pytest.mark.parametrize("batch", [0, 1, 3, 17])
@pytest.mark.parametrize("num_slots", [1, 6, 37, 130])
@pytest.mark.parametrize("per_request_seed", [False, True])
@pytest.mark.parametrize("per_request_offset", [False, True])
def test_fast_uniforms_match_plain(batch, num_slots, per_request_seed, per_request_offset):
    g = torch.Generator().manual_seed(batch * 1000 + num_slots)
    for _ in range(4):  # repeated calls of one shape reuse the buffers: nothing may carry over
        seed = random_int64(g, batch if per_request_seed else 1)
        offset = random_int64(g, batch if per_request_offset else 1)
        want = R.request_uniforms(seed, offset, batch, num_slots)
        got = R.request_uniforms_fast(seed, offset, batch, num_slots)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.equal(got, want)


def test_fast_uniforms_in_inference_mode_and_threads():
    """The buffers of a shape are per thread; results stay right when threads share a shape."""
    import threading

    g = torch.Generator().manual_seed(3)
    cases = [(random_int64(g, 1), random_int64(g, 5)) for _ in range(8)]
    wanted = [R.request_uniforms(s, o, 5, 40) for s, o in cases]
    with torch.inference_mode():
        assert torch.equal(R.request_uniforms_fast(*cases[0], 5, 40), wanted[0])
    failures = []

    def work(k):
        for _ in range(50):
            for (seed, offset), want in zip(cases[k::2], wanted[k::2]):
                if not torch.equal(R.request_uniforms_fast(seed, offset, 5, 40), want):
                    failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


@pytest.mark.parametrize("num_slots", [1, 2, 37, 130])
def test_host_uniforms_match_plain(num_slots):
    g = torch.Generator().manual_seed(num_slots)
    seeds, offsets = random_int64(g, 40).tolist(), random_int64(g, 40).tolist()
    for seed, offset in zip(seeds, offsets):
        want = R.request_uniforms(torch.tensor([seed]), torch.tensor([offset]), 3, num_slots)
        for stream in range(3):  # one seed for a batch of 3: the stream is the row
            assert R.request_uniforms_host(seed, offset, stream, num_slots) == want[stream].tolist()
    for stream in (2**31, 2**32 - 1):  # streams beyond any batch, against the Python model
        got = R.request_uniforms_host(-5, 2**40, stream, num_slots)
        assert got == [expected_uniform(-5, 2**40, stream, s) for s in range(num_slots)]


# ----------------------------------------------------------------------------------------------
# Width invariance: no slot depends on the width N a request is padded to, so a request gets the
# same tokens and counts whatever its neighbours' lengths make the batch's width.

def _padded(rows: torch.Tensor, width: int, gen: torch.Generator) -> torch.Tensor:
    """rows (B, n, V) with random rows appended up to (B, width, V): rows no request reads."""
    extra = torch.rand(rows.shape[0], width - rows.shape[1], rows.shape[2], generator=gen)
    return torch.cat([rows, extra.to(rows.dtype)], dim=1)


def _with_width(inputs: dict, num_draft: int, gen: torch.Generator) -> dict:
    """The call's inputs with every request's drafts padded with -1 to num_draft positions."""
    ids = inputs["draft_token_ids"]
    padding = torch.full((ids.shape[0], num_draft - ids.shape[1]), -1, dtype=ids.dtype)
    wide = dict(inputs, draft_token_ids=torch.cat([ids, padding], dim=1))
    for name in ("draft_probs", "draft_logits"):
        if wide.get(name) is not None:
            wide[name] = _padded(wide[name], num_draft, gen)
    target = "target_logits" if "target_logits" in wide else "target_probs"
    wide[target] = _padded(wide[target], num_draft + 1, gen)
    return wide


WIDTH_CALLS = {
    "token": dict(),
    "token, one-hot drafts": dict(draft_probs=None),
    "block": dict(verification="block"),
    "block, one-hot drafts": dict(draft_probs=None, verification="block"),
    "token from logits": dict(logits=True, temperature=0.8, top_p=0.9, min_p=0.02),
    "block from draft logits": dict(logits=True, draft_logits=True, top_k=20,
                                    verification="block"),
}


@pytest.mark.parametrize("batch", [1, 5], ids=["one request", "a batch"])
@pytest.mark.parametrize("call", WIDTH_CALLS)
def test_a_request_gets_the_same_tokens_at_every_width(call, batch):
    """Requests of lengths 0..3 (their drafts padded with -1 to 3, as a batch of mixed lengths
    holds them) called again at widths 5 and 8: the same tokens, -1 beyond them, the same counts,
    with one seed for the batch and with per-request seeds. Fails if a slot depends on N."""
    options = dict(WIDTH_CALLS[call])
    logits, draft_logits = options.pop("logits", False), options.pop("draft_logits", False)
    gen = torch.Generator().manual_seed(batch)
    num_draft, vocab = 3, 1500
    target = torch.randn(batch, num_draft + 1, vocab, generator=gen) * 2
    draft = torch.randn(batch, num_draft, vocab, generator=gen) * 2
    ids = torch.multinomial(draft.softmax(-1).view(-1, vocab), 1, generator=gen).view(batch,
                                                                                        num_draft)
    for b in range(batch):
        ids[b, (b * 7 + 3) % (num_draft + 1):] = -1  # request b keeps its first L_b drafts
    if logits:
        inputs = dict(draft_probs=None if draft_logits else draft.softmax(-1),
                      draft_token_ids=ids, target_logits=target,
                      draft_logits=draft if draft_logits else None)
        function = specops.chain_speculative_sampling_from_logits
    else:
        inputs = dict(draft_probs=draft.softmax(-1), draft_token_ids=ids,
                      target_probs=target.softmax(-1))
        function = specops.chain_speculative_sampling
    if "draft_probs" in options:
        inputs["draft_probs"] = options.pop("draft_probs")
    for seed in (1234, torch.arange(batch) * 7 + 1):
        narrow = function(**inputs, seed=seed, offset=3, **options)
        for width in (5, 8):
            out, accepted, emitted = function(**_with_width(inputs, width, gen), seed=seed,
                                              offset=3, **options)
            assert torch.equal(out[:, : num_draft + 1], narrow[0]), (width, seed)
            assert (out[:, num_draft + 1 :] == -1).all()
            assert torch.equal(accepted, narrow[1]) and torch.equal(emitted, narrow[2])


def test_block_and_tree_slots_leave_the_token_slots_as_they_are():
    from specops.chain.block import slots as block
    from specops.chain.token import slots as token
    from specops.tree import slots as tree

    vocab = 1025  # K = 2
    assert [block.stop_slot(vocab, t) for t in (1, 2, 3)] == [4, 6, 8]  # K + 2t, between coins
    assert list(range(block.num_slots(3, vocab)))[block.stop_slots(vocab, 3)] == [4, 6, 8]
    assert block.coin_slot is token.coin_slot and block.race_slot is token.race_slot
    # A tree's node i has the chain's coin of position i - 1; draw r starts at r (K + 1).
    assert [tree.coin_slot(vocab, i) for i in (1, 2)] == [3, 5]
    assert [tree.draw_slot(vocab, r) for r in (0, 1, 2)] == [0, 3, 6]
    assert tree.race_slot(vocab, 1, 1) == 5


@pytest.mark.parametrize("draft", [True, False], ids=["draft probabilities", "target-only"])
def test_a_tree_gets_the_same_tokens_with_absent_nodes_appended(draft):
    """A tree of M nodes and the same tree with absent nodes after them (a batch padded to a
    larger tree): the same tokens, nodes and counts. Fails if a slot depends on M."""
    from inputs import full_tree, tree_inputs

    gen = torch.Generator().manual_seed(3)
    # Target-only keeps a node when the target's draw is its token: few tokens, peaked rows.
    batch, vocab, sharp = (6, 1500, 1.0) if draft else (6, 6, 8.0)
    parents = full_tree(2, 3)
    num_nodes = parents.numel()
    q, ids, parents, p = tree_inputs(batch, num_nodes, vocab, draft=draft, parents=parents,
                                     sharp=sharp, seed=5, device="cpu")
    narrow = specops.tree_speculative_sampling(q, ids, parents, p, seed=99, offset=2)
    extra = 5
    wide_ids = torch.cat([ids, torch.full((batch, extra), -1, dtype=ids.dtype)], dim=1)
    wide_parents = torch.cat([parents, torch.zeros(batch, extra, dtype=parents.dtype)], dim=1)
    wide = specops.tree_speculative_sampling(
        None if q is None else _padded(q, num_nodes + 1 + extra, gen), wide_ids, wide_parents,
        _padded(p, num_nodes + 1 + extra, gen), seed=99, offset=2)
    assert torch.equal(wide[0][:, : num_nodes + 1], narrow[0])
    assert torch.equal(wide[1][:, :num_nodes], narrow[1])
    assert (wide[1][:, num_nodes:] == -1).all() and torch.equal(wide[2], narrow[2])
    assert (narrow[2] > 0).any()  # some drafts are kept: the coins and draws past the root count
