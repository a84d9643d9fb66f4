"""Edge cases with exactly predictable outcomes (docs/token.md)."""

from __future__ import annotations

import pytest
import torch

import specops

SEEDS = range(25)


def check_format(out, d, emitted, vocab):
    """Output = the first e drafts, then one token in [-1, V), then -1 (semantics step 4)."""
    batch, num_draft = d.shape
    assert out.shape == (batch, num_draft + 1) and out.dtype == torch.int32
    for b in range(batch):
        e = int(emitted[b])
        assert 0 <= e <= num_draft
        assert out[b, :e].tolist() == d[b, :e].tolist()
        assert -1 <= int(out[b, e]) < vocab
        assert (out[b, e + 1 :] == -1).all()


def random_rows(shape, seed, sparsity=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g)
    if sparsity:
        x = x * (torch.rand(shape, generator=g) >= sparsity)
    return x / x.sum(-1, keepdim=True).clamp_min(1e-30)


def test_p_equal_q_accepts_all_drafts():
    batch, num_draft, vocab = 64, 4, 300
    p = random_rows((batch, num_draft + 1, vocab), 0)
    g = torch.Generator().manual_seed(1)
    d = torch.multinomial(p[:, :num_draft].reshape(-1, vocab), 1, generator=g).reshape(batch, num_draft)
    for seed in range(5):
        out, acc, emit = specops.chain_speculative_sampling(p[:, :num_draft], d, p, seed=seed)
        assert torch.equal(out[:, :num_draft], d.int())
        assert (acc == num_draft).all() and (emit == num_draft).all()
        bonus = out[:, num_draft].long()
        assert (p[torch.arange(batch), num_draft, bonus] > 0).all()


def test_p_zero_at_draft_rejects():
    batch, num_draft, vocab = 32, 3, 100
    p = random_rows((batch, num_draft + 1, vocab), 2)
    q = random_rows((batch, num_draft, vocab), 3)
    d = torch.randint(0, vocab, (batch, num_draft), generator=torch.Generator().manual_seed(4))
    p[torch.arange(batch)[:, None], torch.arange(num_draft)[None, :], d] = 0.0
    for seed in SEEDS:
        out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=seed)
        assert (emit == 0).all() and (acc == 0).all()
        assert (out[:, 1:] == -1).all()
        token = out[:, 0].long()
        assert (token != d[:, 0]).all()
        assert (p[torch.arange(batch), 0, token] > 0).all()
    # p = 0 at the draft of position 1 only: position 0 (p == q) accepted, position 1 rejected.
    p2 = q.clone()
    p2 = torch.cat([p2, p[:, num_draft:]], 1)
    p2[torch.arange(batch), 1, d[:, 1]] = 0.0
    out, acc, emit = specops.chain_speculative_sampling(q, d, p2, seed=0)
    # Position 2 (p == q) is still accepted by its own coin: accepted counts it.
    assert (emit == 1).all() and (acc == num_draft - 1).all()


def test_p_ge_q_always_accepts():
    # p >= q > 0 at the draft: accepted whatever the coin (semantics step 3), also in fp16/bf16.
    batch, num_draft, vocab = 16, 3, 64
    q = random_rows((batch, num_draft, vocab), 5)
    p = random_rows((batch, num_draft + 1, vocab), 6)
    d = torch.randint(0, vocab, (batch, num_draft), generator=torch.Generator().manual_seed(7))
    idx = (torch.arange(batch)[:, None], torch.arange(num_draft)[None, :], d)
    p[idx] = q[idx]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for seed in range(5):
            _, acc, emit = specops.chain_speculative_sampling(q.to(dtype), d, p.to(dtype), seed=seed)
            assert (emit == num_draft).all() and (acc == num_draft).all()


def test_one_hot_targets_are_deterministic():
    # One-hot p: the draft is accepted iff it is the target's token, else the residual is all at
    # the target's token; the output is the target's chain whatever the seed and the drafts.
    batch, num_draft, vocab = 20, 4, 2500
    g = torch.Generator().manual_seed(8)
    target = torch.randint(0, vocab, (batch, num_draft + 1), generator=g)
    p = torch.zeros(batch, num_draft + 1, vocab)
    p.scatter_(2, target[..., None], 1.0)
    q = random_rows((batch, num_draft, vocab), 9)
    d = target[:, :num_draft].clone()
    wrong = torch.rand(batch, num_draft, generator=g) < 0.3
    d[wrong] = (d[wrong] + 1) % vocab
    first_wrong = torch.where(wrong.any(1), wrong.int().argmax(1), num_draft)
    expected = torch.full((batch, num_draft + 1), -1)
    for b in range(batch):
        e = int(first_wrong[b])
        expected[b, : e + 1] = target[b, : e + 1]
    for draft in (q, None):
        for seed in range(10):
            out, acc, emit = specops.chain_speculative_sampling(draft, d, p, seed=seed)
            assert out.tolist() == expected.tolist()
            assert torch.equal(emit.long(), first_wrong)
            assert torch.equal(acc.long(), (~wrong).sum(1))


def test_sparse_supports_never_emit_impossible_tokens():
    batch, num_draft, vocab = 40, 3, 3000  # 3 chunks
    for trial in range(3):
        p = random_rows((batch, num_draft + 1, vocab), 10 + trial, sparsity=0.995)
        q = random_rows((batch, num_draft, vocab), 20 + trial, sparsity=0.99)
        # Drafts from q where it has mass, so acceptance and rejection both happen.
        gen = torch.Generator().manual_seed(30 + trial)
        d = torch.multinomial(q.reshape(-1, vocab) + 1e-12, 1, generator=gen).reshape(batch, num_draft)
        for seed in range(10):
            out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=seed, offset=trial)
            check_format(out, d, emit, vocab)
            for b in range(batch):
                e = int(emit[b])
                for j in range(e + 1):
                    t = int(out[b, j])
                    assert t >= 0 and p[b, j, t] > 0, (b, j, t)
                if e < num_draft:
                    # The rejected position samples from relu(p - q) (p has mass, so not empty
                    # unless p <= q everywhere): the token has p > q there.
                    residual = (p[b, e] - q[b, e]).clamp_min(0)
                    if residual.sum() > 0:
                        assert residual[int(out[b, e])] > 0


def test_padding_shorter_drafts():
    # Drafts of lengths 0..N in one batch, -1 padded; p == q on the valid part, so e = length and
    # output[e] is drawn from p_e, never from relu(p_e - q_e): q_e is one-hot at token 0 where p_e
    # is 0.5, so the residual would never give token 0, while p_e gives it half of the time.
    num_draft, vocab = 4, 6
    lengths = torch.tensor([0, 1, 2, 3, 4, 2])
    batch = len(lengths)
    q = random_rows((batch, num_draft, vocab), 11)
    p = torch.cat([q, random_rows((batch, 1, vocab), 12)], 1)
    d = torch.multinomial(q.reshape(-1, vocab), 1, generator=torch.Generator().manual_seed(13))
    d = d.reshape(batch, num_draft)
    for b, n in enumerate(lengths.tolist()):
        d[b, n:] = -1
        if n < num_draft:
            p[b, n] = torch.tensor([0.5, 0.5, 0, 0, 0, 0])
            q[b, n] = torch.tensor([1.0, 0, 0, 0, 0, 0])
    zeros = torch.zeros(batch, dtype=torch.long)
    for seed in range(60):
        out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=seed)
        assert torch.equal(emit.long(), lengths) and torch.equal(acc.long(), lengths)
        check_format(out, d, emit, vocab)
        for b, n in enumerate(lengths.tolist()):
            assert p[b, n, int(out[b, n])] > 0
            if n < num_draft:
                zeros[b] += int(out[b, n]) == 0
    padded = lengths < num_draft
    # Each padded request drew token 0 ~30 times out of 60; the residual would never give it.
    assert ((zeros[padded] > 10) & (zeros[padded] < 50)).all(), zeros


def test_ids_at_or_beyond_vocab_behave_like_padding():
    num_draft, vocab = 3, 10
    p = random_rows((1, num_draft + 1, vocab), 13)
    q = p[:, :num_draft].clone()
    base = torch.tensor([[4, 7, -1]])
    ref = specops.chain_speculative_sampling(q, base, p, seed=5)
    for bad in (vocab, vocab + 1, 2**31 - 1, -2, -(2**31)):
        d = base.clone()
        d[0, 2] = bad
        for id_dtype in (torch.int32, torch.int64):
            got = specops.chain_speculative_sampling(q, d.to(id_dtype), p, seed=5)
            assert got[0].tolist() == ref[0].tolist()
            assert got[1].tolist() == ref[1].tolist() == [2]
            assert got[2].tolist() == ref[2].tolist() == [2]
    # int64 ids far beyond int32 never wrap around into the vocabulary.
    d = torch.tensor([[4, 7, 2**32 + 3]])
    out, _, emit = specops.chain_speculative_sampling(q, d, p, seed=5)
    assert out.tolist() == ref[0].tolist() and emit.tolist() == [2]


def test_draft_probs_none_equals_explicit_one_hot():
    # None means q_j = one-hot(d_j): same coins, same residual (p without d), same tokens.
    batch, num_draft, vocab = 50, 3, 1500
    p = random_rows((batch, num_draft + 1, vocab), 14, sparsity=0.9)
    g = torch.Generator().manual_seed(15)
    d = torch.multinomial(p[:, :num_draft].reshape(-1, vocab), 1, generator=g).reshape(batch, num_draft)
    d[::7, 1] = -1
    one_hot = torch.zeros(batch, num_draft, vocab)
    one_hot.scatter_(2, d.clamp_min(0)[..., None], 1.0)
    for seed in range(5):
        a = specops.chain_speculative_sampling(None, d, p, seed=seed)
        b = specops.chain_speculative_sampling(one_hot, d, p, seed=seed)
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    # Acceptance with one-hot drafts is u < p(d): p(d) = 1 always accepts.
    p1 = torch.zeros(1, 3, 4)
    p1[0, 0, 2] = p1[0, 1, 3] = p1[0, 2, 1] = 1.0
    out, acc, emit = specops.chain_speculative_sampling(None, torch.tensor([[2, 3]]), p1, seed=0)
    assert out.tolist() == [[2, 3, 1]] and acc.tolist() == [2] and emit.tolist() == [2]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_same_tokens_as_float32(dtype):
    # Multiples of 1/256 below 1 are exact in fp16 and bf16: the op computes in float32, so the
    # tokens and counters must be identical to the float32 call.
    batch, num_draft, vocab = 100, 3, 1100
    g = torch.Generator().manual_seed(16)
    support = torch.rand(batch, num_draft + 1, vocab, generator=g) < 0.01  # shared by p and q
    p = torch.randint(0, 256, support.shape, generator=g) * support / 256.0
    q = torch.randint(1, 256, support.shape, generator=g)[:, :num_draft] * support[:, :num_draft] / 256.0
    d = torch.multinomial(q.reshape(-1, vocab) + 1e-9, 1, generator=g).reshape(batch, num_draft)
    assert torch.equal(p.to(dtype).float(), p) and torch.equal(q.to(dtype).float(), q)
    for seed in range(3):
        ref = specops.chain_speculative_sampling(q, d, p, seed=seed)
        got = specops.chain_speculative_sampling(q.to(dtype), d, p.to(dtype), seed=seed)
        for x, y in zip(ref, got):
            assert torch.equal(x, y)
        ref = specops.chain_speculative_sampling(None, d, p, seed=seed)
        got = specops.chain_speculative_sampling(None, d, p.to(dtype), seed=seed)
        for x, y in zip(ref, got):
            assert torch.equal(x, y)
    assert 0 < int(ref[2].sum()) < batch * num_draft  # both acceptance and rejection occurred


def test_output_format_on_random_inputs():
    batch, num_draft, vocab = 200, 5, 40
    p = random_rows((batch, num_draft + 1, vocab), 17)
    q = random_rows((batch, num_draft, vocab), 18)
    gen = torch.Generator().manual_seed(19)
    d = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, num_draft)
    d[torch.rand(batch, num_draft, generator=gen) < 0.1] = -1
    for seed in range(3):
        out, acc, emit = specops.chain_speculative_sampling(q, d, p, seed=seed)
        check_format(out, d, emit, vocab)
        assert (acc >= emit).all() and (acc <= num_draft).all()
        assert (out[torch.arange(batch), emit.long()] >= 0).all()  # every row here has mass


def test_single_token_vocab_and_single_draft():
    p = torch.ones(3, 2, 1)
    d = torch.tensor([[0], [-1], [1]])
    out, acc, emit = specops.chain_speculative_sampling(None, d, p, seed=0)
    assert out.tolist() == [[0, 0], [0, -1], [0, -1]]
    assert acc.tolist() == [1, 0, 0] and emit.tolist() == [1, 0, 0]


def test_non_contiguous_inputs_match_contiguous():
    # Strided, transposed and batch-expanded layouts read the same values as contiguous copies.
    batch, num_draft, vocab = 6, 3, 1300
    g = torch.Generator().manual_seed(19)
    wide_p = torch.rand(batch, num_draft + 1, 2 * vocab, generator=g)
    p = wide_p[:, :, ::2]  # strided vocabulary
    q = torch.rand(num_draft, batch, vocab, generator=g).transpose(0, 1)  # batch not outermost
    d = torch.randint(0, vocab, (num_draft, batch), generator=g).T  # transposed ids
    p[:, :num_draft].scatter_(2, d[..., None], 0.5)  # p(d) ~ q(d): a mix of accepts and rejects
    ref = specops.chain_speculative_sampling(q.contiguous(), d.contiguous(), p.contiguous(), seed=4)
    got = specops.chain_speculative_sampling(q, d, p, seed=4)
    for x, y in zip(ref, got):
        assert torch.equal(x, y)
    assert 0 < int(ref[2].sum()) < batch * num_draft
    # One row shared by the whole batch through expand() (no copy).
    row_p, row_q = p[:1], q[:1]
    ref = specops.chain_speculative_sampling(
        row_q.expand(batch, -1, -1).contiguous(), d, row_p.expand(batch, -1, -1).contiguous(), seed=4)
    got = specops.chain_speculative_sampling(row_q.expand(batch, -1, -1), d, row_p.expand(batch, -1, -1), seed=4)
    for x, y in zip(ref, got):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # float32: the sparse row add
def test_rows_past_2_31_elements(dtype):
    """64-bit indexing: the last request's rows start past element 2**31 of the inputs. The inputs
    are allocated but, except for those rows, never written: untouched pages cost no memory, so
    this runs on a CI machine (~8.6 GB of address space in float16, 17 GB in float32, under 1 GB
    resident)."""
    batch, num_draft, vocab = 1040, 63, 32768
    target = torch.empty(batch, num_draft + 1, vocab, dtype=dtype)
    draft = torch.empty(batch, num_draft, vocab, dtype=dtype)
    last, token = batch - 1, 30001
    assert last * (num_draft + 1) * vocab > 2**31
    # The last request: draft id 5 is certain under p and q at position 0 (accepted whatever the
    # coin), impossible under p at position 1 (rejected), where the residual relu(p_1 - q_1) is
    # one-hot at `token`. Its result depends on these rows alone; a 32-bit offset anywhere would
    # read other memory and change it.
    target[last, :2].zero_()
    draft[last, :2].zero_()
    target[last, 0, 5] = draft[last, 0, 5] = 1.0
    target[last, 1, token] = draft[last, 1, 5] = 1.0
    ids = torch.full((batch, num_draft), 5)
    ids[:last] = -1  # the other requests sample their (zero) p_0: no empty residual, no fallback
    out, accepted, emitted = specops.chain_speculative_sampling(draft, ids, target, seed=3)
    assert out[last].tolist() == [5, token] + [-1] * (num_draft - 1)
    assert accepted[last] == 1 and emitted[last] == 1


@pytest.mark.parametrize("batch", [1, 4], ids=["one request", "a batch"])
@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("drafts", ["probs", "one-hot", "logits", "draft logits"])
def test_no_drafts_give_one_token_from_the_single_row(drafts, verification, batch):
    """N = 0 (an engine's step where a request has no drafts): one token from the single row,
    counters unchanged; the very tokens of a call with one draft of -1 (width invariance), from
    the public function and from the reference."""
    from specops.chain.block.reference import block_speculative_sampling_reference
    from specops.chain.token.reference import chain_speculative_sampling_reference

    vocab = 1500
    g = torch.Generator().manual_seed(batch)
    logits = torch.randn(batch, 1, vocab, generator=g) * 3
    draft_logits = torch.randn(batch, 0, vocab, generator=g)
    ids = torch.empty(batch, 0, dtype=torch.int64)
    one = torch.full((batch, 1), -1, dtype=torch.int64)
    extra = torch.rand(batch, 1, vocab, generator=g)
    if drafts in ("logits", "draft logits"):
        def call(ids, target, draft):
            return specops.chain_speculative_sampling_from_logits(
                None if drafts == "draft logits" else draft.softmax(-1), ids, target,
                draft_logits=draft if drafts == "draft logits" else None, top_p=0.9,
                seed=5, offset=1, verification=verification)
        none, padded = call(ids, logits, draft_logits), call(one, torch.cat([logits, extra], 1), extra)
    else:
        draft = None if drafts == "one-hot" else draft_logits.softmax(-1)
        wide_draft = None if drafts == "one-hot" else extra
        target = logits.softmax(-1)
        none = specops.chain_speculative_sampling(draft, ids, target, seed=5, offset=1,
                                                  verification=verification)
        padded = specops.chain_speculative_sampling(wide_draft, one, torch.cat([target, extra], 1),
                                                    seed=5, offset=1, verification=verification)
        reference = (chain_speculative_sampling_reference if verification == "token"
                     else block_speculative_sampling_reference)
        acc, emit = torch.zeros(batch, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)
        plain = reference(draft, ids, target, acc, emit, torch.tensor([5]), torch.tensor([1]))
        assert torch.equal(plain, none[0]) and not acc.any() and not emit.any()
    out, accepted, emitted = none
    assert out.shape == (batch, 1) and (out >= 0).all() and (out < vocab).all()
    assert not accepted.any() and not emitted.any()
    assert torch.equal(out[:, 0], padded[0][:, 0]) and (padded[0][:, 1] == -1).all()
