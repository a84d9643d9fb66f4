"""The block-verification Triton kernels against the plain reference, token for token (under
TRITON_INTERPRET=1 without a GPU), and the edge cases docs/block.md defines."""

from __future__ import annotations

import pytest
import torch

from inputs import DEVICE, make_inputs, seeds
from specops.chain.block.launch import block_speculative_sampling_triton
from specops.chain.block.reference import block_speculative_sampling_reference

pytestmark = pytest.mark.interpreter


def run_both(draft_probs, ids, target, seed, offset, num_splits=None, counter_dtype=torch.int32):
    batch = ids.shape[0]
    results = []
    for fn in (block_speculative_sampling_reference, block_speculative_sampling_triton):
        acc = torch.full((batch,), 5, dtype=counter_dtype, device=target.device)
        emit = torch.full((batch,), 7, dtype=counter_dtype, device=target.device)
        kwargs = {"num_splits": num_splits} if fn is block_speculative_sampling_triton else {}
        out = fn(draft_probs, ids, target, acc, emit, seed, offset, **kwargs)
        results.append((out, acc, emit))
    return results


def assert_same(results):
    (o1, a1, e1), (o2, a2, e2) = results
    assert torch.equal(o1, o2), (o1, o2)
    assert torch.equal(a1, a2) and torch.equal(e1, e2)


@pytest.mark.parametrize("batch,num_draft,vocab", [(6, 1, 5), (5, 3, 37), (3, 4, 2500), (2, 7, 1024)])
@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("per_request", [True, False])
def test_kernel_matches_reference(batch, num_draft, vocab, draft, per_request):
    q, d, p = make_inputs(batch, num_draft, vocab, draft=draft, seed=vocab + num_draft)
    seed, offset = seeds(batch, per_request)
    assert_same(run_both(q, d, p, seed, offset))


@pytest.mark.parametrize("num_draft,vocab,seed", [(9, 17 * 1024 + 5, 9), (17, 9 * 1024 + 3, 5)])
def test_long_drafts_over_many_chunks(num_draft, vocab, seed):
    """BLOCK_N 16 and 32: the scan sums each row's chunk masses 16 and 8 chunks at a time, in
    several steps here (fails when a step is skipped)."""
    q, d, p = make_inputs(4, num_draft, vocab, sharp=1.0, seed=seed)
    assert_same(run_both(q, d, p, *seeds(4, True)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_matches_reference_half_precision(dtype):
    q, d, p = make_inputs(4, 3, 1500, dtype=dtype, ids_dtype=torch.int32, seed=3)
    assert_same(run_both(q, d, p, *seeds(4, True), counter_dtype=torch.int64))


def test_output_does_not_depend_on_splits():
    q, d, p = make_inputs(3, 2, 3 * 1024 + 5, seed=4)
    seed, offset = seeds(3, False)
    # 4 chunks: 3 programs cannot hold equal numbers of chunks, so the launcher makes it 2 of 2.
    outs = [run_both(q, d, p, seed, offset, num_splits=s)[1][0] for s in (1, 2, 3, 4)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("draft", [True, False])
def test_groups_of_chunks(monkeypatch, draft):
    # A program takes its chunks' masses GROUP at a time; with 2-chunk groups, 5 chunks make
    # groups that end inside a program's range and groups cut short by it.
    import specops.chain.block.launch as launch

    monkeypatch.setattr(launch, "GROUP", 2)
    q, d, p = make_inputs(4, 2, 5 * 1024 + 3, draft=draft, seed=1)
    for splits in (1, 2):
        assert_same(run_both(q, d, p, *seeds(4, True), num_splits=splits))


def test_agreement_over_many_random_requests():
    # Small V keeps the interpreter fast; many requests, varied lengths, seeds per request.
    for trial in range(2):
        q, d, p = make_inputs(32, 1 + 2 * trial, 11 + 7 * trial, draft=trial % 2 == 0, seed=100 + trial,
                              sharp=1.0 + 2 * trial)
        d[torch.rand(d.shape, device=d.device) < 0.05] = -1  # some shorter drafts
        assert_same(run_both(q, d, p, *seeds(32, True, base=trial)))


def test_edge_cases_match_reference():
    """Invalid ids (negative, >= V), NaN / inf / negative probabilities, rows without mass,
    identical models, and p[d] = 0 with q[d] = 0."""
    batch, num_draft, vocab = 8, 3, 6
    q, d, p = make_inputs(batch, num_draft, vocab, seed=9)
    d[0, 1] = -1          # draft ends at 1
    d[1, 0] = vocab + 3   # ends at 0: an id >= V
    d[1, 2] = 2           # a valid id after the end is ignored
    p[2, 1] = float("nan")
    q[2, 0, d[2, 0]] = float("inf")
    p[3, 2, :] = -1.0     # a row without mass
    p[4] = 0.0            # no mass anywhere: -1 tokens
    q[5] = p[5, :num_draft]  # identical models: every draft kept
    p[6, 0, d[6, 0]] = 0.0
    q[6, 0, d[6, 0]] = 0.0
    results = run_both(q, d, p, *seeds(batch, True))
    assert_same(results)
    out, acc, emit = results[0]
    assert emit[0] <= 7 + 1  # the draft ended at 1: at most one draft kept
    assert emit[1] == 7 and (out[1, 1:] == -1).all()
    assert out[4, 0] == -1 and emit[4] == 7
    assert emit[5] == 7 + num_draft


def test_identical_models_keep_every_draft_one_hot():
    # draft_probs=None with p one-hot at the drafts: w stays 1 and every h is 1.
    batch, num_draft, vocab = 4, 3, 9
    d = torch.randint(0, vocab, (batch, num_draft), device=DEVICE)
    p = torch.rand(batch, num_draft + 1, vocab, device=DEVICE)
    p[:, :num_draft] = torch.nn.functional.one_hot(d, vocab).float()
    results = run_both(None, d, p, *seeds(batch, False))
    assert_same(results)
    out, _, emit = results[0]
    assert torch.equal(out[:, :num_draft].long(), d) and (emit == 7 + num_draft).all()

