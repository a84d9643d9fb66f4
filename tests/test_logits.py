"""Rows from logits (specops/core/logits/rule.py): the processed distributions against a plain float64
restatement of the rule, the order of the steps, ties, bad logits and bad parameters, and the
verifiers' registration, checks and compile behaviour."""

from __future__ import annotations

import math

import numpy
import pytest
import torch

import specops
import specops.varlen
from specops.core.logits import cpu as logits_cpu
from specops.core.logits import rule as processing

OP = torch.ops.specops.chain_speculative_sampling_from_logits
BLOCK_OP = torch.ops.specops.chain_block_speculative_sampling_from_logits


def naive(x: torch.Tensor, t: float, k: int, p: float, m: float) -> torch.Tensor:
    """The rule in float64, one row, by sorting: softmax(x / t), then min-p, top-k, top-p on what
    is left (ties kept), renormalised."""
    x = torch.where(torch.isfinite(x), x.double(), -torch.inf)
    if t == 0:
        return torch.nn.functional.one_hot(x.argmax(), len(x)).double()
    probs = torch.softmax(x / t, -1)
    keep = probs >= m * probs.max()
    if 0 < k < len(x):
        kth = torch.where(keep, probs, -1.0).sort(descending=True).values[k - 1]
        keep &= probs >= kth
    if p < 1:
        kept = torch.where(keep, probs, 0.0)
        ranked = kept.sort(descending=True).values
        cut = int((ranked.cumsum(0) / kept.sum() >= p).nonzero()[0])
        keep &= probs >= ranked[cut]
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum()


def rows(logits, t, k, p, m):
    n = logits.shape[0]
    return processing.processed_rows(
        logits, torch.full((n,), t), torch.full((n,), k, dtype=torch.int64), torch.full((n,), p),
        torch.full((n,), m))


@pytest.mark.parametrize("t,k,p,m", [(1.0, 0, 1.0, 0.0), (0.5, 5, 1.0, 0.0), (2.0, 0, 0.8, 0.0),
                                     (1.0, 0, 1.0, 0.1), (0.7, 8, 0.9, 0.02), (0.0, 3, 0.5, 0.5),
                                     (1.3, 40, 0.3, 0.0)])
def test_processed_rows_follow_the_rule(t, k, p, m):
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(32, 50, generator=g)
    got = rows(logits, t, k, p, m)
    for row, x in zip(got, logits):
        expected = naive(x, t, k, p, m)
        assert torch.equal(row > 0, expected > 0)  # the same tokens kept (no near-ties here)
        assert torch.allclose(row.double(), expected, rtol=1e-5, atol=1e-7)


def test_ties_at_the_k_th_value_are_all_kept_and_equal_logits_share_alike():
    x = torch.tensor([[1.0, 3.0, 2.0, 2.0, 2.0, 0.0]])
    out = rows(x, 1.0, 2, 1.0, 0.0)[0]
    assert (out > 0).tolist() == [False, True, True, True, True, False]
    assert out[2] == out[3] == out[4]
    greedy = rows(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), 0.0, 0, 1.0, 0.0)[0]
    assert greedy.tolist() == [0.0, 1.0, 0.0, 0.0]  # the lowest index of equal maxima


def test_the_steps_come_in_vllms_order():
    # min-p removes the tail first, so top-p's mass is of what min-p left: with min-p applied
    # after top-p instead, top-p would keep two tokens.
    x = torch.log(torch.tensor([[0.4, 0.3, 0.1, 0.1, 0.1]]))
    out = rows(x, 1.0, 0, 0.6, 0.5)[0]
    assert (out > 0).tolist() == [True, True, False, False, False]
    assert torch.allclose(out[:2], torch.tensor([0.4, 0.3]) / 0.7)
    only_top_p = rows(x, 1.0, 0, 0.6, 0.0)[0]
    assert (only_top_p > 0).tolist() == [True, True, False, False, False]
    # top-k before top-p: top-p's mass is of the k kept.
    x = torch.log(torch.tensor([[0.3, 0.25, 0.2, 0.15, 0.1]]))
    assert (rows(x, 1.0, 2, 0.5, 0.0)[0] > 0).tolist() == [True, False, False, False, False]
    assert (rows(x, 1.0, 0, 0.5, 0.0)[0] > 0).tolist() == [True, True, False, False, False]


def test_bad_logits_count_as_minus_infinity_and_bad_parameters_give_no_mass():
    x = torch.tensor([[1.0, float("nan"), float("inf"), 2.0, -float("inf")],
                      [float("nan")] * 5])
    out = rows(x, 1.0, 0, 1.0, 0.0)
    assert out[0, 1:3].tolist() == [0.0, 0.0] and out[0, 4] == 0 and out[0, [0, 3]].sum() > 0.99
    assert out[1].tolist() == [0.0] * 5
    assert rows(x, 0.0, 0, 1.0, 0.0)[0].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]
    clean = torch.randn(1, 5)
    for t, k, p, m in ((-1.0, 0, 1.0, 0.0), (float("nan"), 0, 1.0, 0.0), (1.0, -1, 1.0, 0.0),
                       (1.0, 0, 0.0, 0.0), (1.0, 0, 1.5, 0.0), (1.0, 0, 1.0, 1.5)):
        assert rows(clean, t, k, p, m).sum() == 0, (t, k, p, m)


def inputs(batch=4, num_draft=3, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = 2 * torch.randn(batch, num_draft + 1, vocab, generator=g)
    draft = target[:, :num_draft] + torch.randn(batch, num_draft, vocab, generator=g)
    ids = torch.randint(0, vocab, (batch, num_draft), generator=g)
    return target, draft, ids


def op_args(target, draft, ids, draft_source, temperature=(0.7,), top_k=(5,), top_p=(0.9,),
            min_p=(0.05,)):
    q = torch.softmax(draft, -1) if draft_source == "probs" else None
    logits = draft if draft_source == "logits" else None
    return (q, ids, target, logits, torch.tensor([5]), torch.tensor([0]),
            torch.tensor(temperature), torch.tensor(top_k), torch.tensor(top_p),
            torch.tensor(min_p))


@pytest.mark.parametrize("op", [OP, BLOCK_OP], ids=["token", "block"])
@pytest.mark.parametrize("draft_source", ["probs", "logits", "greedy"])
def test_opcheck(op, draft_source):
    target, draft, ids = inputs()
    torch.library.opcheck(op, op_args(target, draft, ids, draft_source))
    per_request = op_args(target, draft, ids, draft_source, temperature=(0.0, 1.0, 0.5, 2.0),
                          top_k=(0, 3, 0, 9), top_p=(1.0, 0.8, 0.5, 1.0),
                          min_p=(0.0, 0.0, 0.1, 0.3))
    torch.library.opcheck(op, per_request)


# The draft's own parameters (draft_temperature, ...): the draft's logits processed by them are the
# draft probabilities the rules verify against.
DRAFT_OWN = dict(draft_temperature=torch.tensor([0.5, 1.0, 0.8, 2.0]), draft_top_k=3,
                 draft_top_p=torch.tensor([1.0, 0.7, 1.0, 0.9]), draft_min_p=0.05)
TARGET_OWN = dict(temperature=torch.tensor([0.7, 1.0, 1.3, 0.9]), top_k=0, top_p=0.95, min_p=0.0)


def _draft_own_call(entry, target, draft, ids, draft_probs=None, **kwargs):
    """Each function that verifies from logits, on the same requests (seeds per request)."""
    batch, positions, vocab = target.shape
    kwargs = dict(kwargs, seed=torch.arange(batch), **TARGET_OWN)
    if entry == "varlen":
        cu = torch.arange(batch + 1) * (positions - 1)
        flat = None if draft is None else draft.reshape(-1, vocab)
        return specops.varlen.chain_speculative_sampling_from_logits(
            None if draft_probs is None else draft_probs.reshape(-1, vocab), ids.reshape(-1),
            target.reshape(-1, vocab), cu, positions - 1, draft_logits=flat, **kwargs)[0]
    if entry == "tree":  # a chain of nodes; the leaf's draft row is not read
        parents = torch.arange(positions - 1).expand(batch, -1)
        pad = lambda rows: None if rows is None else torch.cat([rows, rows[:, -1:]], 1)  # noqa
        return specops.tree_speculative_sampling_from_logits(
            pad(draft_probs), ids, parents, target, draft_logits=pad(draft), **kwargs)[0]
    return specops.chain_speculative_sampling_from_logits(
        draft_probs, ids, target, draft_logits=draft, verification=entry, **kwargs)[0]


@pytest.mark.parametrize("entry", ["token", "block", "varlen", "tree"])
def test_the_drafts_own_parameters_process_its_logits(entry):
    target, draft, ids = inputs(seed=3)
    own = _draft_own_call(entry, target, draft, ids, **DRAFT_OWN)
    batch, num_draft, vocab = draft.shape
    values = {name: torch.as_tensor(value).expand(batch) for name, value in DRAFT_OWN.items()}
    processed = processing.processed_requests(draft, values["draft_temperature"],
                                              values["draft_top_k"], values["draft_top_p"],
                                              values["draft_min_p"])
    assert torch.equal(own, _draft_own_call(entry, target, None, ids, draft_probs=processed))
    # None is the target's: the same as passing the target's values, and not the draft's own.
    default = _draft_own_call(entry, target, draft, ids)
    given = {f"draft_{name}": value for name, value in TARGET_OWN.items()}
    assert torch.equal(default, _draft_own_call(entry, target, draft, ids, **given))
    assert not torch.equal(default, own)


@pytest.mark.parametrize("changes, error, fragment", [
    (dict(draft_logits=None), ValueError, "draft_top_k processes draft_logits, which were not"),
    (dict(draft_top_p=1.5), ValueError, "draft_top_p must be a number in (0, 1]"),
    (dict(draft_temperature=torch.tensor([1], dtype=torch.int32)), TypeError,
     "draft_temperature must have dtype float32 or float64"),
    (dict(draft_min_p=torch.ones(3)), ValueError, "draft_min_p must be a 1-D tensor of 1 or"),
])
def test_the_drafts_own_parameters_are_checked_by_name(changes, error, fragment):
    target, draft, ids = inputs()
    kwargs = dict(draft_logits=draft, draft_top_k=3, seed=1)
    kwargs.update(changes)
    call = lambda: specops.chain_speculative_sampling_from_logits(  # noqa: E731
        None, ids, target, **kwargs)
    with pytest.raises(error, match=pytest.importorskip("re").escape(fragment)):
        call()
    torch._dynamo.reset()
    with pytest.raises(Exception, match=pytest.importorskip("re").escape(fragment)):
        torch.compile(call, backend="aot_eager", fullgraph=True)()


def test_the_drafts_own_parameter_values_are_checked_under_validation(monkeypatch):
    target, draft, ids = inputs()
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    with pytest.raises(ValueError, match=r"draft_temperature must be a number >= 0 .* at index"):
        specops.chain_speculative_sampling_from_logits(
            None, ids, target, draft_logits=draft, seed=1,
            draft_temperature=torch.tensor([1.0, -2.0, 1.0, 1.0]))


@pytest.mark.parametrize("op", [OP, BLOCK_OP], ids=["token", "block"])
def test_opcheck_with_the_drafts_own_parameters(op):
    target, draft, ids = inputs()
    torch.library.opcheck(op, (*op_args(target, draft, ids, "logits"),
                               torch.tensor([0.5, 1.0, 2.0, 0.0]), None, torch.tensor([0.8]),
                               torch.tensor([0.1])))


@pytest.mark.parametrize("verification", ["token", "block"])
def test_the_ops_return_counts_the_functions_add_to_the_counters_given(verification):
    """The ops from logits mutate nothing (torch's wrapper of a mutating op costs a time that
    grows with the square of the schema's length): they return this call's counts, which the
    public functions add to each counter given, in its dtype, or return where none is given."""
    op = OP if verification == "token" else BLOCK_OP
    assert not op.default._schema.is_mutable
    target, draft, _ = inputs()
    ids = draft.argmax(dim=-1)  # likely kept: counts that are not all 0
    out, accepted, emitted = op(*op_args(target, draft, ids, "logits"))
    assert accepted.dtype == emitted.dtype == torch.int32 and int(emitted.sum()) > 0
    given = torch.full((4,), 10, dtype=torch.int64)
    for calls in (1, 2):
        got = specops.chain_speculative_sampling_from_logits(
            None, ids, target, given, draft_logits=draft, temperature=0.7, top_k=5, top_p=0.9,
            min_p=0.05, seed=5, verification=verification)
        assert torch.equal(got[0], out) and got[1] is given
        assert torch.equal(given, 10 + calls * accepted) and torch.equal(got[2], emitted)
    given = torch.full((4,), 10, dtype=torch.int32)
    flat = specops.varlen.chain_speculative_sampling_from_logits(
        None, ids.reshape(-1), target.reshape(-1, target.shape[-1]), torch.arange(5) * 3, 3,
        None, given, draft_logits=draft.reshape(-1, target.shape[-1]), temperature=0.7, top_k=5,
        top_p=0.9, min_p=0.05, seed=5, verification=verification)
    assert torch.equal(flat[1], accepted) and torch.equal(given, 10 + emitted)


def test_public_function_matches_the_op_and_numbers_match_tensors():
    target, draft, ids = inputs()
    args = op_args(target, draft, ids, "logits")
    expected, accepted, emitted = OP(*args)
    out, acc, emit = specops.chain_speculative_sampling_from_logits(
        None, ids, target, draft_logits=draft, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05,
        seed=5)
    assert torch.equal(out, expected) and torch.equal(acc, accepted)
    assert torch.equal(emit, emitted)
    same = specops.chain_speculative_sampling_from_logits(
        None, ids, target, draft_logits=draft, temperature=torch.full((4,), 0.7),
        top_k=torch.tensor([5], dtype=torch.int32), top_p=torch.tensor(0.9, dtype=torch.float64),
        min_p=torch.tensor([0.05]), seed=5)[0]
    assert torch.equal(same, expected)


def test_batch_invariance_under_permutation_and_other_neighbours():
    target, draft, ids = inputs(batch=6, seed=2)
    seeds = torch.arange(100, 106)
    temperature = torch.tensor([0.0, 1.0, 0.5, 2.0, 0.0, 1.5])
    top_k = torch.tensor([0, 3, 0, 9, 2, 0])
    run = lambda perm, t, k: specops.chain_speculative_sampling_from_logits(  # noqa: E731
        None, ids[perm], target[perm], draft_logits=draft[perm], temperature=t[perm],
        top_k=k[perm], seed=seeds[perm])[0]
    base = run(torch.arange(6), temperature, top_k)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    assert torch.equal(run(perm, temperature, top_k), base[perm])
    others = temperature.clone()
    others[[0, 1, 3]] = torch.tensor([2.0, 0.0, 0.3])  # the neighbours of requests 2, 4, 5
    changed = run(torch.arange(6), others, top_k)
    assert torch.equal(changed[[2, 4, 5]], base[[2, 4, 5]])


@pytest.mark.parametrize("changes,error,fragment", [
    (dict(temperature=-0.5), ValueError, "temperature must be a number >= 0"),
    (dict(temperature=float("nan")), ValueError, "temperature must be a number >= 0"),
    (dict(top_p=0.0), ValueError, "top_p must be a number in (0, 1]"),
    (dict(top_p=1.2), ValueError, "top_p must be a number in (0, 1]"),
    (dict(top_k=-1), ValueError, "top_k must be an int >= 0"),
    (dict(top_k=2.5), TypeError, "top_k must be an int"),
    (dict(min_p=1.5), ValueError, "min_p must be a number in [0, 1]"),
    (dict(temperature=torch.ones(3)), ValueError, "temperature must be a 1-D tensor of 1 or"),
    (dict(top_k=torch.ones(4)), TypeError, "top_k must have dtype int32 or int64"),
    (dict(top_p=torch.ones(4, dtype=torch.float16)), TypeError, "top_p must have dtype float32"),
    (dict(draft_probs=torch.ones(4, 3, 40)), ValueError, "not both"),
    (dict(draft_logits=torch.ones(4, 3, 40, dtype=torch.float16)), TypeError,
     "draft_logits must have the dtype of target_logits"),
])
def test_bad_arguments_are_named_eagerly_and_at_trace_time(changes, error, fragment):
    target, draft, ids = inputs()
    kwargs = dict(draft_logits=draft, seed=1)
    draft_probs = changes.pop("draft_probs", None)
    kwargs.update(changes)
    call = lambda: specops.chain_speculative_sampling_from_logits(  # noqa: E731
        draft_probs, ids, target, **kwargs)
    with pytest.raises(error, match=pytest.importorskip("re").escape(fragment)):
        call()
    torch._dynamo.reset()
    with pytest.raises(Exception, match=pytest.importorskip("re").escape(fragment)):
        torch.compile(call, backend="aot_eager", fullgraph=True)()


def test_validation_mode_refuses_bad_values_inside_parameter_tensors(monkeypatch):
    target, draft, ids = inputs()
    bad = dict(temperature=torch.tensor([1.0, -1.0, 1.0, 1.0]))
    monkeypatch.delenv("SPECOPS_VALIDATE", raising=False)
    out = specops.chain_speculative_sampling_from_logits(None, ids, target, draft_logits=draft,
                                                         seed=torch.arange(4), **bad)[0]
    assert (out[1] == -1).all()  # no mass for that request alone
    good = specops.chain_speculative_sampling_from_logits(
        None, ids, target, draft_logits=draft, seed=torch.arange(4),
        temperature=torch.tensor([1.0, 1.0, 1.0, 1.0]))[0]
    assert torch.equal(out[[0, 2, 3]], good[[0, 2, 3]])
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    with pytest.raises(ValueError, match=r"temperature must be a number >= 0 .*-1.0 at index \(1,\)"):
        specops.chain_speculative_sampling_from_logits(None, ids, target, draft_logits=draft,
                                                       seed=1, **bad)
    target[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="target_logits must be a number or -inf"):
        specops.chain_speculative_sampling_from_logits(None, ids, target, seed=1)


def test_parameters_are_checked_as_the_float32_values_the_ops_read(monkeypatch):
    """Temperature, top-p and min-p are read as float32, a Python number as the float32 tensor it
    becomes: a top-p of 1e-50 (float32 0) is refused, not silently left without mass; under
    validation a float64 tensor is checked by its float32 rounding (1 + 1e-12 is 1: off), and
    penalties, which the ops read as given, by their own values."""
    target, draft, ids = inputs()
    call = lambda **kw: specops.chain_speculative_sampling_from_logits(None, ids, target, seed=1,
                                                                        **kw)
    monkeypatch.delenv("SPECOPS_VALIDATE", raising=False)
    with pytest.raises(ValueError, match=r"top_p must be .*got 1e-50 \(as float32: 0.0\)"):
        call(top_p=1e-50)
    with pytest.raises(ValueError, match=r"frequency_penalty must be .*\(as float32: inf\)"):
        call(frequency_penalty=1e39, output_token_counts=torch.zeros_like(target[:, 0],
                                                                          dtype=torch.int64))
    # A Python int past float64's range becomes float32's inf too, not an OverflowError; an
    # object a number cannot be made of (an array of several) is refused by name.
    assert torch.equal(call(temperature=10**400)[0], call(temperature=math.inf)[0])
    with pytest.raises(ValueError, match=r"top_p must be .*got 1000"):
        call(top_p=10**400)
    with pytest.raises(TypeError, match=r"temperature must be a number >= 0 .* got ndarray"):
        call(temperature=numpy.array([0.5, 0.7, 0.9, 1.0]))
    f64 = lambda value: torch.tensor([value], dtype=torch.float64)
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    off = call(top_p=f64(1 + 1e-12), min_p=f64(-1e-50))[0]
    assert torch.equal(off, call()[0])
    call(repetition_penalty=f64(1e-50), output_token_counts=torch.zeros_like(
        target[:, 0], dtype=torch.int64))  # > 0 as given
    with pytest.raises(ValueError, match=r"top_p must be .*got 1e-50 \(read as float32: 0.0\)"):
        call(top_p=f64(1e-50))


def _top_k_of_minus_one(entry, top_k):
    target, draft, ids = inputs()
    batch, positions, vocab = target.shape
    if entry == "varlen":
        cu = torch.arange(batch + 1) * (positions - 1)
        return specops.varlen.chain_speculative_sampling_from_logits(
            None, ids.reshape(-1), target.reshape(-1, vocab), cu, positions - 1, top_k=top_k,
            seed=1)
    if entry == "tree":
        parents = torch.arange(positions - 1).expand(batch, -1)
        return specops.tree_speculative_sampling_from_logits(None, ids, parents, target,
                                                             top_k=top_k, seed=1)
    return specops.chain_speculative_sampling_from_logits(None, ids, target, top_k=top_k,
                                                          verification=entry, seed=1)


@pytest.mark.parametrize("entry", ["token", "block", "varlen", "tree"])
def test_a_top_k_of_minus_one_is_refused_by_name(monkeypatch, entry):
    # vLLM and others write -1 for "off"; here 0 is, and the message says so.
    message = r"top_k must be an int >= 0 \(0: off, where some engines write -1\); got -1"
    with pytest.raises(ValueError, match=message):
        _top_k_of_minus_one(entry, -1)
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    with pytest.raises(ValueError, match=message + r" at index \(1,\)"):
        _top_k_of_minus_one(entry, torch.tensor([0, -1, 3, 0]))


@pytest.mark.parametrize("entry", ["token", "block", "varlen", "tree"])
def test_a_top_k_past_int64s_range_keeps_every_token_and_a_non_finite_one_is_refused(entry):
    """A k of 2**63 or more keeps every token, as any k >= V does: the same tokens as top-k off,
    not an overflow inside torch; an infinite or NaN k is not an int, and is refused by name."""
    off = _top_k_of_minus_one(entry, 0)[0]
    for k in (2**63, 10**30, 1e300):
        assert torch.equal(_top_k_of_minus_one(entry, k)[0], off), k
    for k in (math.inf, math.nan):
        with pytest.raises(TypeError, match=r"top_k must be an int; got (inf|nan)"):
            _top_k_of_minus_one(entry, k)


# processing_order="transformers": min-p after top-k and top-p, as Hugging Face applies them.
ORDER_ROWS = dict(temperature=torch.tensor([0.7, 1.0, 1.3, 0.9, 1.0, 0.0]),
                  top_k=torch.tensor([0, 12, 0, 30, 0, 0]),
                  top_p=torch.tensor([0.8, 1.0, 0.6, 0.9, 1.0, 1.0]),
                  min_p=torch.tensor([0.1, 0.2, 0.05, 0.3, 0.0, 0.5]))


def test_transformers_order_is_hugging_faces_warpers():
    """Rows (temperature, top-k, top-p, min-p each) against transformers' own warpers in its
    order: the same kept tokens and the same probabilities (to float32 rounding); vLLM's order
    keeps other tokens in some rows."""
    from transformers.generation import logits_process as hf

    g = torch.Generator().manual_seed(21)
    x = 3 * torch.randn(40, 300, generator=g)
    differ = 0
    for row in x:
        for t, k, p, m in ((0.7, 0, 0.8, 0.1), (1.0, 40, 0.9, 0.2), (1.3, 0, 0.6, 0.05),
                           (0.9, 25, 0.95, 0.3)):
            scores = row[None].clone()
            for warper in (hf.TemperatureLogitsWarper(t), hf.TopKLogitsWarper(k) if k else None,
                           hf.TopPLogitsWarper(p), hf.MinPLogitsWarper(m)):
                scores = scores if warper is None else warper(None, scores)
            theirs = scores.softmax(-1)[0]
            values = [torch.tensor([v]) for v in (t, k, p, m)]
            ours = processing.processed_rows(row[None], *values, min_p_last=True)[0]
            assert torch.equal(ours > 0, theirs > 0)
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
            vllm = processing.processed_rows(row[None], *values)[0]
            differ += not torch.equal(vllm > 0, ours > 0)
    assert differ > 20  # of 160 rows: the orders are two rules


@pytest.mark.parametrize("vocab", [300, 3000])
def test_cpu_processing_in_transformers_order_is_the_rules(vocab):
    g = torch.Generator().manual_seed(22)
    for rows in (3, 40):  # the host's few rows and the general path
        x = (3 * torch.randn(rows, vocab, generator=g)).round(decimals=1)  # ties
        values = [v.repeat(7)[:rows] for v in ORDER_ROWS.values()]
        expected = processing.processed_rows(x, *values, min_p_last=True)
        assert torch.equal(logits_cpu.processed_rows(x, *values, min_p_last=True), expected)
        assert not torch.equal(expected, processing.processed_rows(x, *values))


@pytest.mark.parametrize("entry", ["token", "block", "varlen", "tree"])
def test_processing_order_reaches_every_function(entry):
    target, draft, ids = inputs(batch=24, vocab=60, seed=5)
    values = {name: value.repeat(4) for name, value in ORDER_ROWS.items()}
    order = dict(values, draft_logits=draft, seed=torch.arange(24))
    got = _order_call(entry, target, ids, processing_order="transformers", **order)
    rows = processing.processed_requests(target, *values.values(), min_p_last=True)
    drafts = processing.processed_requests(draft, *values.values(), min_p_last=True)
    expected = _order_call(entry, rows, ids, probabilities=drafts, seed=torch.arange(24))
    assert torch.equal(got, expected)
    assert not torch.equal(got, _order_call(entry, target, ids, **order))


def _order_call(entry, target, ids, probabilities=None, **kwargs):
    """A from-logits function on logits, or (``probabilities``: the draft's) its probabilities
    twin on processed target rows."""
    batch, positions, vocab = target.shape
    if entry == "tree":
        parents = torch.arange(positions - 1).expand(batch, -1)
        pad = lambda rows: None if rows is None else torch.cat([rows, rows[:, -1:]], 1)  # noqa
        if probabilities is not None:
            return specops.tree_speculative_sampling(pad(probabilities), ids, parents, target,
                                                     **kwargs)[0]
        kwargs["draft_logits"] = pad(kwargs["draft_logits"])
        return specops.tree_speculative_sampling_from_logits(None, ids, parents, target,
                                                             **kwargs)[0]
    if entry == "varlen":
        cu = torch.arange(batch + 1) * (positions - 1)
        flat = lambda rows: rows.reshape(-1, vocab)  # noqa: E731
        if probabilities is not None:
            return specops.varlen.chain_speculative_sampling(
                flat(probabilities), ids.reshape(-1), flat(target), cu, positions - 1,
                **kwargs)[0]
        kwargs["draft_logits"] = flat(kwargs["draft_logits"])
        return specops.varlen.chain_speculative_sampling_from_logits(
            None, ids.reshape(-1), flat(target), cu, positions - 1, **kwargs)[0]
    if probabilities is not None:
        return specops.chain_speculative_sampling(probabilities, ids, target, verification=entry,
                                                  **kwargs)[0]
    return specops.chain_speculative_sampling_from_logits(None, ids, target, verification=entry,
                                                          **kwargs)[0]


def test_an_unknown_processing_order_is_refused_by_name():
    target, _, ids = inputs()
    call = lambda: specops.chain_speculative_sampling_from_logits(  # noqa: E731
        None, ids, target, processing_order="hf", seed=1)
    with pytest.raises(ValueError, match='processing_order must be "vllm" or "transformers"'):
        call()
    # Not a string at all: refused by name too, not by the op's schema, on every entry and path.
    batch, positions, vocab = target.shape
    cu = torch.arange(batch + 1) * (positions - 1)
    parents = torch.arange(positions - 1).expand(batch, -1)
    entries = [lambda **kw: specops.chain_speculative_sampling_from_logits(None, ids, target, **kw),
               lambda **kw: specops.chain_speculative_sampling_from_logits(
                   None, ids, target, acceptance="typical", **kw),
               lambda **kw: specops.tree_speculative_sampling_from_logits(None, ids, parents,
                                                                          target, **kw),
               lambda **kw: specops.varlen.chain_speculative_sampling_from_logits(
                   None, ids.reshape(-1), target.reshape(-1, vocab), cu, positions - 1, **kw)]
    for entry in entries:
        for order in (None, 1, ["vllm"]):
            with pytest.raises(ValueError, match="processing_order must be .*got"):
                entry(processing_order=order, seed=1)
    torch._dynamo.reset()
    with pytest.raises(Exception, match='processing_order must be "vllm" or "transformers"'):
        torch.compile(call, backend="aot_eager", fullgraph=True)()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_matches_eager_and_new_values_do_not_recompile(backend):
    target, draft, ids = inputs()
    torch._dynamo.reset()
    compiled = torch.compile(OP, backend=backend, fullgraph=True)
    from torch._dynamo.utils import counters

    counters.clear()
    for t, k, p, m in ((0.7, 5, 0.9, 0.05), (0.0, 0, 1.0, 0.0), (1.8, 2, 0.4, 0.2)):
        args = op_args(target, draft, ids, "logits", (t,), (k,), (p,), (m,))
        eager = op_args(target, draft, ids, "logits", (t,), (k,), (p,), (m,))
        for got, expected in zip(compiled(*args), OP(*eager), strict=True):
            assert torch.equal(got, expected)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.parametrize("levels,margin", [(None, None), (7, None), (None, -0.25)],
                         ids=["distinct", "ties", "range-missing-the-answer"])
def test_cpu_backends_processing_gives_the_rules_rows_bit_for_bit(levels, margin, monkeypatch):
    """core/logits/cpu.py runs each step on the rows that need it, top-k by topk and top-p over a
    narrowed range of ranks: the rows must be the rule's, bit for bit, for every mix of
    parameters per row, ties (logits on a few levels), bad logits and bad parameters. A negative
    margin makes every narrowed range miss the answer: the exact checks must send those rows to
    the whole range (a check that passed them would give other thresholds)."""
    from specops.core.logits import cpu as logits_cpu

    if margin is not None:
        monkeypatch.setattr(logits_cpu, "_MARGIN", margin)

    gen = torch.Generator().manual_seed(3)
    n, vocab = 96, 3000  # rows spanning three chunks, the last one partial
    logits = torch.randn(n, vocab, generator=gen) * 4
    if levels:
        logits = (logits * levels / 8).round()
    logits[5, :100] = torch.nan
    logits[6] = -torch.inf
    logits[7, 17] = torch.inf
    pick = lambda *values: torch.tensor(values)[torch.randint(len(values), (n,), generator=gen)]
    temperature = pick(0.0, 0.5, 1.0, 2.0, -1.0, 1e-40)
    top_k = pick(0, 1, 5, 50, 2999, 3000, 10**6)
    top_p = pick(1.0, 0.9, 0.5, 0.999, 1e-6, 0.0)
    min_p = pick(0.0, 0.0, 0.05, 0.5, 1.0)
    for params in [(temperature, top_k, top_p, min_p),
                   (temperature, torch.full_like(top_k, 40), top_p, min_p),  # few ranked for top-p
                   (temperature, torch.zeros_like(top_k), torch.ones_like(top_p), min_p * 0)]:
        expected = processing.processed_rows(logits, *params)
        got = logits_cpu.processed_rows(logits, *params)
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("vocab", [20, 40, 100])
def test_the_cpu_backends_rows_from_draft_logits_are_the_references(vocab):
    """The target's and the draft's rows as the CPU backends process them (``processed_inputs``
    with the host path, which processes a single request's target and draft rows at once) are the
    reference's bit for bit, at vocabularies that are not a multiple of the vector width: exp2's
    vectorised body and its scalar tail round apart, so the joined rows must take exp2 on each
    set's rows apart (one exp2 over the joined rows moves the tail)."""
    from specops.chain.processed import processed_inputs

    gen = torch.Generator().manual_seed(vocab)
    for trial in range(30):
        batch, num_draft = 1 + trial % 2, 1 + trial % 4
        target = torch.randn(batch, num_draft + 1, vocab, generator=gen) * 2
        draft = torch.randn(batch, num_draft, vocab, generator=gen) * 2
        ids = torch.randint(0, vocab, (batch, num_draft), generator=gen)
        temperature = torch.rand(1, generator=gen) + 0.5 if trial % 5 else torch.tensor([0.0])
        parameters = (temperature, torch.tensor([trial % 7]),
                      torch.rand(1, generator=gen, dtype=torch.float64),
                      torch.tensor([0.05 * (trial % 3)]))
        # The draft's own parameters, of other dtypes, on some trials; a bad logit on others.
        own = ((torch.tensor([0.9], dtype=torch.float64), torch.tensor([3], dtype=torch.int32),
                torch.tensor([0.8]), None) if trial % 3 == 1 else (None,) * 4)
        if trial % 6 == 5:
            draft[0, 0, 1] = torch.nan
        last = trial % 2 == 1
        expected = processed_inputs(None, ids, target, draft, parameters, own, min_p_last=last)
        got = processed_inputs(None, ids, target, draft, parameters, own,
                               logits_cpu.processed_row_sets, min_p_last=last)
        for rows, want in zip(got, expected):
            assert torch.equal(rows.view(torch.int32), want.view(torch.int32)), trial


def test_few_rows_do_not_follow_the_default_dtype():
    """The host path's thresholds and scales are float32 whatever torch's default dtype is: its
    rows are the rule's float32 rows, on short rows and long, with the parameters shared by the
    rows or their own."""
    from specops.core.logits import cpu as logits_cpu

    gen = torch.Generator().manual_seed(4)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for vocab in (20, 3000):
            logits = torch.randn(3, vocab, generator=gen, dtype=torch.float32) * 3
            for params in ((torch.tensor([1.0, 0.0, 0.7]), torch.tensor([0, 0, 3]),
                            torch.tensor([0.9, 1.0, 0.5]), torch.tensor([0.0, 0.0, 0.1])),
                           (torch.full((3,), 0.7), torch.full((3,), 3), torch.full((3,), 0.8),
                            torch.full((3,), 0.05))):
                for last in (False, True):
                    got = logits_cpu.few_rows(logits, *params, min_p_last=last)
                    expected = processing.processed_rows(logits, *params, min_p_last=last)
                    assert got.dtype == expected.dtype == torch.float32
                    assert torch.equal(got, expected), (vocab, last)
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("vocab", [37, 300, 3000])
def test_processed_rows_do_not_depend_on_the_logits_layout(vocab):
    """Column-major rows (a transposed view) and rows inside wider ones give the contiguous rows'
    results, bit for bit, in the reference and on the CPU's paths (the target's and the draft's
    rows joined or apart, short rows' table, top-p's histogram past 256 values): torch's CPU
    exp2 and sums round by the order of memory, so every path reads the rows in row-major order."""
    from specops.chain.processed import processed_inputs

    gen = torch.Generator().manual_seed(vocab)
    num_draft = 4
    target = torch.randn(1, num_draft + 1, vocab, generator=gen) * 3
    draft = torch.randn(1, num_draft, vocab, generator=gen) * 3
    ids = torch.zeros(1, num_draft, dtype=torch.long)

    def layouts(rows):
        transposed = rows[0].t().contiguous().t()[None]  # the same values, column-major
        wider = torch.zeros(*rows.shape[:2], vocab + 5)
        wider[..., 2 : vocab + 2] = rows
        return rows, transposed, wider[..., 2 : vocab + 2]

    for t, k, p, m in ((1.0, 0, 1.0, 0.0), (0.7, 0, 0.5, 0.1), (1.3, 5, 0.9, 0.05)):
        parameters = (torch.tensor([t]), torch.tensor([k]), torch.tensor([p]), torch.tensor([m]))
        for last in (False, True):
            expected = None
            for rows, drafts in zip(layouts(target), layouts(draft)):
                for process in (processing.each_processed, logits_cpu.processed_row_sets):
                    got = processed_inputs(None, ids, rows, drafts, parameters, (None,) * 4,
                                           process, min_p_last=last)
                    got = [rows.view(torch.int32) for rows in got]
                    expected = expected or got
                    assert all(torch.equal(a, b) for a, b in zip(got, expected)), (t, k, p, m)


@pytest.mark.parametrize("vocab", [16, 40, 3000])
@pytest.mark.parametrize("shared", [True, False], ids=["one-request", "per-row"])
def test_few_rows_on_the_host_give_the_rules_rows_bit_for_bit(vocab, shared):
    """A few rows (a single request's) are decided on the host (logits_cpu.few_rows): thresholds
    instead of masks, masses summed on the host, top-p ranking only the weights near its goal (a
    histogram's window; top-k's ranks; ``torch.topk`` where the window reaches the zero weights,
    as P = 0.99999 makes it; on short rows a table of the mass at every rank). Its rows must be
    the rule's bit for bit, in both orders, with ties, for short rows (one ``where``) and long
    ones (``torch.threshold`` row by row), with -inf masks (which the host path weighs as it
    weighs every logit: exp2(-inf) = 0) and bad logits; rows with a valid logit must not leave
    it for the general path."""
    from specops.core.logits import cpu as logits_cpu

    gen = torch.Generator().manual_seed(vocab)
    for trial in range(40):
        n = int(torch.randint(1, logits_cpu.FEW_ROWS + 1, (1,), generator=gen))
        logits = torch.randn(n, vocab, generator=gen) * float(1 + trial % 5)
        if trial % 3 == 0:
            logits = logits.round()  # ties, at every threshold
        if trial % 2 == 1:  # masked logits; every row keeps a valid one
            logits[:, :: 3] = -torch.inf
        if trial % 4 == 1:  # and bad ones
            logits[0, 1] = torch.nan
            logits[-1, -1] = torch.inf
        count = 1 if shared else n
        pick = lambda *values: torch.tensor(values)[
            torch.randint(len(values), (count,), generator=gen)].expand(n)
        # Temperatures that are not powers of 2: c = LOG2E / T rounds (once); one below
        # about 4.2e-39: c saturates at float32's largest value; +inf: c = 0.
        params = (pick(0.0, 0.5, 1.0, 2.0, 0.7, 1.0724719762802124, 1e-40, math.inf),
                  pick(0, 1, 5, 50, vocab - 1, vocab),
                  pick(1.0, 0.9, 0.5, 0.999, 0.99999, 1e-6), pick(0.0, 0.0, 0.05, 0.5, 1.0))
        last = trial % 2 == 1  # min-p in transformers' order, after top-p
        before = logits.clone()
        got = logits_cpu.few_rows(logits, *params, min_p_last=last)
        assert got is not None
        assert torch.equal(logits.view(torch.int32), before.view(torch.int32))  # untouched
        expected = processing.processed_rows(logits, *params, min_p_last=last)
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), trial


def test_the_largest_values_of_long_rows_are_topks():
    """Long rows rank their k largest values among the blocks with the largest maxima: the
    values must be ``torch.topk``'s, with ties, with the largest values crowded into one block or
    spread one a block, and in a last partial block."""
    from specops.core.logits import cpu as logits_cpu

    gen = torch.Generator().manual_seed(9)
    for vocab in (4096, 5000):
        rows = torch.rand(6, vocab, generator=gen)
        rows[1] = rows[1].round(decimals=1)  # ties
        rows[2, 64:80] += 1.0  # the largest crowded into one block
        rows[3, :: logits_cpu.BLOCK] += 1.0  # one in every block
        rows[4, -3:] += 1.0  # in the last, partial block (5000)
        rows[5] = -1.0
        for k in (1, 2, 7):
            assert k * logits_cpu.BLOCK * logits_cpu.SPARSE <= vocab  # the blocked way
            got = logits_cpu.largest_values(rows, k)
            assert torch.equal(got, rows.topk(k, dim=-1).values), (vocab, k)


@pytest.mark.parametrize("vocab", [3, 3000])
def test_top_p_keeps_no_more_once_the_mass_reaches_its_goal_exactly(vocab):
    """W(t) >= P * W(0), not >: weights 1, 1/2, 1/2 (T = log2(e) makes c = 1, so e = 2^x
    exactly) and P = 1/2 reach the goal at the largest weight alone, on the host's short rows and
    long rows as in the rule."""
    from specops.core.logits import cpu as logits_cpu

    logits = torch.full((2, vocab), -200.0)  # weights 2^-200: 0 in float32
    logits[:, :3] = torch.tensor([0.0, -1.0, -1.0])
    params = (torch.full((2,), processing.LOG2E), torch.zeros(2, dtype=torch.long),
              torch.full((2,), 0.5), torch.zeros(2))
    expected = torch.zeros(2, vocab)
    expected[:, 0] = 1.0
    assert torch.equal(processing.processed_rows(logits, *params), expected)
    assert torch.equal(logits_cpu.processed_rows(logits, *params), expected)


def test_few_rows_leave_a_temperature_below_float32s_range_to_the_general_path():
    """A float64 temperature above 0 that rounds to float32's 0 is decided by the general path,
    not divided by on the host."""
    from specops.core.logits import cpu as logits_cpu

    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    params = (torch.tensor([1e-46, 1.0, 0.5], dtype=torch.float64),
              torch.zeros(3, dtype=torch.long), torch.ones(3), torch.zeros(3))
    assert logits_cpu.few_rows(logits, *params) is None


@pytest.mark.parametrize("rows", [4, 20], ids=["few-rows", "general"])
def test_a_logit_whose_distance_below_the_largest_passes_float32s_range_is_never_kept(rows):
    """x - m rounding to -inf makes a finite logit invalid (rule step 1): at T = +inf (c = 0) its
    weight would be -inf * 0 = NaN, which a comparison drops in one step and a rank puts first in
    another. The rule keeps every other token of such a row (each weighs 1) in both orders; the
    CPU backend's rows (the host path for a few rows, the general one for many), beside rows
    whose top-k threshold is above 0, must be the rule's."""
    from specops.core.logits import cpu as logits_cpu

    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(rows, 40, generator=gen)
    logits[::2, 0], logits[::2, 1] = 3e38, -3e38
    full = lambda value, dtype=torch.float32: torch.full((rows,), value, dtype=dtype)
    for temperature in (math.inf, 1.0):
        for top_k, top_p, min_p in [(0, 1.0, 0.0), (1, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.9, 0.0),
                                    (0, 1.0, 0.05), (5, 0.9, 0.05)]:
            params = (full(temperature), full(top_k, torch.long), full(top_p), full(min_p))
            for last in (False, True):
                expected = processing.processed_rows(logits, *params, min_p_last=last)
                assert expected[::2, 1].eq(0).all() and expected.sum(-1).gt(0.99).all()
                got = logits_cpu.processed_rows(logits, *params, min_p_last=last)
                assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), (
                    temperature, top_k, top_p, min_p, last)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_a_single_requests_draft_probabilities_beside_logits_are_read_as_the_reference_reads_them(
        verification):
    """A single request (the CPU backends' host path) verified from logits with draft
    probabilities the caller gave: those are not processed rows, so negative, infinite, NaN and
    too large values count as 0, as the reference reads them (the processed rows the host path
    trusts are the target's and a draft's processed from its logits). Same tokens and counts as
    the reference's, from every seed."""
    from specops.chain.block import cpu as block_cpu, reference as block_reference
    from specops.chain.token import cpu as token_cpu, reference as token_reference

    cpu, reference = {"token": (token_cpu.chain_speculative_sampling_from_logits_cpu,
                                token_reference.chain_speculative_sampling_from_logits_reference),
                      "block": (block_cpu.block_speculative_sampling_from_logits_cpu,
                                block_reference.block_speculative_sampling_from_logits_reference),
                      }[verification]
    gen = torch.Generator().manual_seed(7)
    vocab, num_draft = 12, 3
    params = (torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.0]))
    differed = 0
    for trial in range(40):
        target = torch.randn(1, num_draft + 1, vocab, generator=gen)
        draft = torch.rand(1, num_draft, vocab, generator=gen) / vocab
        ids = torch.randint(0, vocab, (1, num_draft), generator=gen)
        bad = [-0.5, -torch.inf, torch.inf, torch.nan, 1e36][trial % 5]
        draft[0, :, (ids[0, 0] + 1) % vocab] = bad  # beside the drafts, where residuals are read
        outputs = []
        for fn in (cpu, reference):
            counts = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
            tokens = fn(draft, ids, target, None, *counts, torch.tensor([trial]),
                        torch.tensor([0]), *params)
            outputs.append((tokens.tolist(), [c.tolist() for c in counts]))
        assert outputs[0] == outputs[1], (trial, bad)
        clean = draft.clone()
        clean[0, :, (ids[0, 0] + 1) % vocab] = 0.0
        counts = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        differed += cpu(clean, ids, target, None, *counts, torch.tensor([trial]),
                        torch.tensor([0]), *params).tolist() != outputs[0][0]
    # Sanitised to 0, the bad values give the tokens of a draft row with 0 there.
    assert differed == 0
