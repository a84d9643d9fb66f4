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
    assert slots.cdf_slot(4) == 4
    assert slots.race_slot(4, 0) == 5 and slots.race_slot(4, 7) == 12
    assert slots.num_slots(4, 1025) == 7


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
    # slot j < N is position j's coin, slot N the in-chunk inverse-CDF uniform, slot N+1+k the
    # race uniform of chunk k.  V spans 3 chunks (the last one partial).
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
        u = [expected_uniform(seed, offset, b, s) for s in range(num_draft + 1 + 3)]
        acc = [u[j] * float(q[b, j, d[b, j]]) < float(p[b, j, d[b, j]]) for j in range(num_draft)]
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
        keys = [-math.log(u[num_draft + 1 + k]) / m if m > 0 else math.inf for k, m in enumerate(masses)]
        k = keys.index(min(keys))
        cdf = chunks[k].double().cumsum(0)
        token = k * 1024 + int(torch.nonzero(cdf > u[num_draft] * cdf[-1])[0])
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
