"""Bad input: clear errors (the same in eager mode and at trace time), the opt-in value checks of
SPECOPS_VALIDATE=1, and the tolerant behaviour of the default mode (docs/token.md, steps 2-5)."""

from __future__ import annotations

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import specops
from specops.chain.arguments import check_arguments

from tracing import (assert_same_error_under_compile, assert_same_error_under_fake_tensors,  # tests/
                     errors_while_tracing, message_of, with_one_changed)

OP = torch.ops.specops.chain_speculative_sampling
B, N, V = 3, 2, 5


def good_args():
    p = torch.full((B, N + 1, V), 1.0 / V)
    q = torch.full((B, N, V), 1.0 / V)
    d = torch.zeros(B, N, dtype=torch.int64)
    acc = torch.zeros(B, dtype=torch.int32)
    emit = torch.zeros(B, dtype=torch.int64)
    return dict(draft_probs=q, draft_token_ids=d, target_probs=p, accepted_num=acc,
                emitted_num=emit, seed=torch.tensor([1]), offset=torch.tensor([0]))


# (id, argument to replace, replacement, exception type, fragments the message must contain)
BAD = [
    ("target rank 2", "target_probs", torch.zeros(B, V), ValueError,
     ["target_probs", "(batch_size, num_speculate_tokens + 1, vocab_size)", "(3, 5)"]),
    ("target rank 4", "target_probs", torch.zeros(B, N + 1, V, 1), ValueError,
     ["target_probs", "(3, 3, 5, 1)"]),
    ("target N+1 < 2", "target_probs", torch.zeros(B, 1, V), ValueError,
     ["target_probs", "(3, 1, 5)"]),
    ("target dtype", "target_probs", torch.zeros(B, N + 1, V, dtype=torch.float64), TypeError,
     ["target_probs", "float32", "float64"]),
    ("ids rank 1", "draft_token_ids", torch.zeros(B * N, dtype=torch.int64), ValueError,
     ["draft_token_ids", "(3, 2)", "(6,)"]),
    ("ids rank 3", "draft_token_ids", torch.zeros(B, N, 1, dtype=torch.int64), ValueError,
     ["draft_token_ids", "(3, 2)", "(3, 2, 1)"]),
    ("ids batch", "draft_token_ids", torch.zeros(B + 1, N, dtype=torch.int64), ValueError,
     ["draft_token_ids", "(3, 2)", "(4, 2)"]),
    ("ids N", "draft_token_ids", torch.zeros(B, N + 1, dtype=torch.int64), ValueError,
     ["draft_token_ids", "(3, 2)", "(3, 3)"]),
    ("ids float", "draft_token_ids", torch.zeros(B, N), TypeError,
     ["draft_token_ids", "int32 or int64", "float32"]),
    ("ids int16", "draft_token_ids", torch.zeros(B, N, dtype=torch.int16), TypeError,
     ["draft_token_ids", "int16"]),
    ("draft rank 2", "draft_probs", torch.zeros(B, V), ValueError,
     ["draft_probs", "(3, 2, 5)", "(3, 5)"]),
    ("draft batch", "draft_probs", torch.zeros(B + 2, N, V), ValueError,
     ["draft_probs", "(3, 2, 5)", "(5, 2, 5)"]),
    ("draft N", "draft_probs", torch.zeros(B, N + 1, V), ValueError,
     ["draft_probs", "(3, 2, 5)", "(3, 3, 5)"]),
    ("draft vocab", "draft_probs", torch.zeros(B, N, V + 1), ValueError,
     ["draft_probs", "(3, 2, 5)", "(3, 2, 6)"]),
    ("draft dtype mismatch", "draft_probs", torch.zeros(B, N, V, dtype=torch.float16), TypeError,
     ["draft_probs", "float32", "float16"]),
    ("accepted length", "accepted_num", torch.zeros(B + 1, dtype=torch.int32), ValueError,
     ["accepted_num", "(3,)", "(4,)"]),
    ("accepted rank", "accepted_num", torch.zeros(B, 1, dtype=torch.int32), ValueError,
     ["accepted_num", "(3,)", "(3, 1)"]),
    ("accepted dtype", "accepted_num", torch.zeros(B), TypeError,
     ["accepted_num", "int32 or int64", "float32"]),
    ("emitted length", "emitted_num", torch.zeros(B - 1, dtype=torch.int64), ValueError,
     ["emitted_num", "(3,)", "(2,)"]),
    ("emitted dtype", "emitted_num", torch.zeros(B, dtype=torch.uint8), TypeError,
     ["emitted_num", "uint8"]),
    ("seed size", "seed", torch.zeros(2, dtype=torch.int64), ValueError,
     ["seed", "1 or batch_size (3)", "(2,)"]),
    ("seed rank", "seed", torch.zeros(1, 1, dtype=torch.int64), ValueError,
     ["seed", "(1, 1)"]),
    ("seed dtype", "seed", torch.zeros(1, dtype=torch.int32), TypeError, ["seed", "int64", "int32"]),
    ("offset size", "offset", torch.zeros(B + 1, dtype=torch.int64), ValueError,
     ["offset", "1 or batch_size (3)", "(4,)"]),
    ("offset empty", "offset", torch.zeros(0, dtype=torch.int64), ValueError, ["offset", "(0,)"]),
]
ARG_ORDER = ["draft_probs", "draft_token_ids", "target_probs", "accepted_num", "emitted_num",
             "seed", "offset"]


def bad_args(name, value):
    return with_one_changed(good_args(), ARG_ORDER, name, value)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_eager_message(case):
    _, name, value, exc, fragments = case
    message = message_of(exc, OP, *bad_args(name, value))
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_same_error_under_fake_tensors(case):
    _, name, value, exc, _ = case
    args = bad_args(name, value)
    assert_same_error_under_fake_tensors(OP, args, exc, message_of(exc, OP, *args))


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_same_error_under_compile(case):
    _, name, value, exc, _ = case
    args = bad_args(name, value)
    assert_same_error_under_compile(OP, args, exc, message_of(exc, OP, *args))


def _compiled_call(*args):
    return OP(*args)


def test_mixed_devices_named():
    # Only a CPU here: a meta tensor stands in for "another device" at the check level.
    args = good_args()
    for name in ("draft_probs", "draft_token_ids", "accepted_num", "emitted_num", "seed", "offset"):
        bad = dict(args)
        bad[name] = args[name].to("meta")
        with pytest.raises(ValueError, match=rf"^{name} must be on the same device as target_probs \(cpu\); got meta"):
            check_arguments(**bad)


def test_wrapper_errors():
    args = good_args()
    q, d, p = args["draft_probs"], args["draft_token_ids"], args["target_probs"]
    with pytest.raises(ValueError, match=r"seed .*1 or batch_size \(3\).*\(2,\)"):
        specops.chain_speculative_sampling(q, d, p, seed=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"offset .*\(4,\)"):
        specops.chain_speculative_sampling(q, d, p, seed=1, offset=torch.arange(4))
    with pytest.raises(TypeError, match="seed"):
        specops.chain_speculative_sampling(q, d, p, seed=torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"maybe_output_accepted_token_num|accepted_num"):
        specops.chain_speculative_sampling(q, d, p, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="draft_token_ids"):
        specops.chain_speculative_sampling(q, d[:, :1], p, seed=0)
    # A draft_probs=None call checks the remaining arguments just the same.
    with pytest.raises(ValueError, match="draft_token_ids"):
        specops.chain_speculative_sampling(None, d[:2], p, seed=0)


# ----------------------------------------------------------------------------------------------
# SPECOPS_VALIDATE=1: raise on data the default mode tolerates, naming the argument


def validate_call(q, d, p):
    return specops.chain_speculative_sampling(q, d, p, seed=0)


@pytest.mark.parametrize(
    "what,fragments",
    [
        ("id -2", ["draft_token_ids", "-2", "[0, 5)"]),
        ("id V", ["draft_token_ids", "5", "[0, 5)"]),
        ("target nan", ["target_probs", "nan"]),
        ("target inf", ["target_probs", "inf"]),
        ("target negative", ["target_probs", "-0.5"]),
        ("draft nan", ["draft_probs", "nan"]),
        ("draft -inf", ["draft_probs", "-inf"]),
        ("draft negative", ["draft_probs", "-0.25"]),
        ("target huge", ["target_probs", "2**117"]),
        ("target doubled", ["target_probs", "sums to 2", "(1, 2)"]),
        ("draft halved", ["draft_probs", "sums to 0.5", "(2, 0)"]),
    ],
)
def test_validate_mode_raises(monkeypatch, what, fragments):
    args = good_args()
    q, d, p = args["draft_probs"], args["draft_token_ids"].clone(), args["target_probs"].clone()
    q = q.clone()
    edits = {
        "id -2": lambda: d.__setitem__((1, 1), -2),
        "id V": lambda: d.__setitem__((2, 0), V),
        "target nan": lambda: p.__setitem__((1, 2, 3), float("nan")),
        "target inf": lambda: p.__setitem__((0, 0, 0), float("inf")),
        "target negative": lambda: p.__setitem__((2, 1, 4), -0.5),
        "draft nan": lambda: q.__setitem__((0, 1, 1), float("nan")),
        "draft -inf": lambda: q.__setitem__((2, 0, 0), float("-inf")),
        "draft negative": lambda: q.__setitem__((1, 0, 2), -0.25),
        "target huge": lambda: p.__setitem__((1, 0, 1), 2.0**117),
        "target doubled": lambda: p[1, 2].mul_(2),
        "draft halved": lambda: q[2, 0].mul_(0.5),
    }
    edits[what]()
    # Default mode: no error.
    monkeypatch.delenv("SPECOPS_VALIDATE", raising=False)
    validate_call(q, d, p)
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    with pytest.raises(ValueError) as info:
        validate_call(q, d, p)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert "SPECOPS_VALIDATE" in message


def test_validate_mode_accepts_clean_input_and_padding(monkeypatch):
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    args = good_args()
    d = args["draft_token_ids"].clone()
    d[0, 1] = -1  # -1 is padding, legal in validation mode
    d[1] = V - 1
    out, _, _ = specops.chain_speculative_sampling(args["draft_probs"], d, args["target_probs"], seed=3)
    assert out.shape == (B, N + 1)
    for dtype in (torch.float16, torch.bfloat16):
        specops.chain_speculative_sampling(None, d, args["target_probs"].to(dtype), seed=3)
    # Rows past a draft's end are never read, so their mass is not checked; a row without mass
    # has a rule of its own; rounding is within the tolerance.
    p, q = args["target_probs"].clone(), args["draft_probs"].clone()
    p[0, 2], q[0, 1] = 3.0, 0.0
    p[1, 0] = 0.0
    p[2, 1] *= 1.005
    specops.chain_speculative_sampling(q, d, p, seed=3)
    specops.chain_speculative_sampling(q, d, p, seed=3, verification="block")
    monkeypatch.setenv("SPECOPS_VALIDATE", "0")  # "0" means off
    d[2, 0] = -7
    specops.chain_speculative_sampling(None, d, args["target_probs"], seed=3)


# ----------------------------------------------------------------------------------------------
# Default mode: the tolerant semantics of docs/token.md, request by request


def one_hot(t, v=V):
    row = torch.zeros(v)
    row[t] = 1.0
    return row


def run(q, d, p, seed=0, **kw):
    return specops.chain_speculative_sampling(q, d, p, seed=seed, **kw)


@pytest.mark.parametrize("bad_id", [-1, -5, V, V + 100, 2**31 - 1])
def test_out_of_range_id_ends_the_draft(monkeypatch, bad_id):
    monkeypatch.delenv("SPECOPS_VALIDATE", raising=False)
    # Position 0: p == q (always accepted); position 1: bad id -> e = 1, token from p_1 (one-hot 4)
    # even though q_1 would make the residual point elsewhere.
    p = torch.stack([torch.full((V,), 0.2), one_hot(4), one_hot(0)])[None]
    q = torch.stack([torch.full((V,), 0.2), one_hot(4)])[None]
    d = torch.tensor([[2, bad_id]], dtype=torch.int64)
    for seed in range(20):
        out, acc, emit = run(q, d, p, seed)
        assert out.tolist() == [[2, 4, -1]] and acc.tolist() == [1] and emit.tolist() == [1]
    # A bad id first: e = 0, token drawn from p_0 (uniform), the rest -1.
    d = torch.tensor([[bad_id, 1]], dtype=torch.int64)
    seen = set()
    for seed in range(40):
        out, acc, emit = run(q, d, p, seed)
        assert out[0, 1:].tolist() == [-1, -1] and emit.tolist() == [0]
        # Position 1 is valid and p_1[1] = 0: rejected by its own coin.
        assert acc.tolist() == [0]
        seen.add(int(out[0, 0]))
    assert seen == set(range(V))


@pytest.mark.parametrize("bad", [float("nan"), -0.3, float("-inf"), float("inf"), 2.0**117])
def test_bad_target_probability_counts_as_zero(bad):
    # p_0[d_0] is NaN/negative/inf/too large to sum: counts as 0, so the draft is rejected; the residual
    # relu(p - q) with that entry as 0 is all at token 3.
    p = torch.stack([torch.tensor([0.0, bad, 0.0, 0.5, 0.0]), one_hot(0), one_hot(0)])[None]
    q = torch.stack([one_hot(1), one_hot(2)])[None]
    d = torch.tensor([[1, 2]])
    for seed in range(20):
        out, acc, emit = run(q, d, p, seed)
        assert out.tolist() == [[3, -1, -1]] and emit.tolist() == [0] and acc.tolist() == [0]


def test_bad_draft_probability_counts_as_zero():
    # q_0[d_0] NaN -> 0: u * 0 < p is always true when p > 0, so the draft is accepted.
    p = torch.stack([torch.tensor([0.0, 0.1, 0.0, 0.9, 0.0]), one_hot(2), one_hot(3)])[None]
    for bad in (float("nan"), -1.0, float("-inf"), 3e38):
        q = torch.stack([torch.tensor([0.0, bad, 0.0, 0.0, 0.0]), one_hot(2)])[None]
        d = torch.tensor([[1, 2]])
        for seed in range(10):
            out, acc, emit = run(q, d, p, seed)
            assert out.tolist() == [[1, 2, 3]] and acc.tolist() == [2] and emit.tolist() == [2]


def test_all_zero_residual_falls_back_to_p():
    # p(d) = 0 rejects; p <= q everywhere, so relu(p - q) = 0 and the token comes from p_0.
    p = torch.stack([torch.tensor([0.0, 0.0, 0.2, 0.0, 0.0]), one_hot(0), one_hot(0)])[None]
    q = torch.stack([torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0]), one_hot(0)])[None]
    d = torch.tensor([[0, 0]])
    for seed in range(20):
        out, _, emit = run(q, d, p, seed)
        assert out.tolist() == [[2, -1, -1]] and emit.tolist() == [0]
    # draft_probs=None, p_0 = 0.5 at the draft and 0 elsewhere: a rejected draft leaves an empty
    # residual (p without d), so the fallback p_0 gives the draft token again.
    p1 = torch.stack([torch.tensor([0.0, 0.5, 0.0, 0.0, 0.0]), one_hot(0), one_hot(0)])[None]
    d1 = torch.tensor([[1, 0]])
    rejected = 0
    for seed in range(40):
        out, _, emit = run(None, d1, p1, seed)
        assert out[0, 0].item() == 1
        rejected += emit.item() == 0
    assert 5 < rejected < 35  # both paths were taken


@pytest.mark.parametrize("fill", [0.0, float("nan"), -1.0])
def test_all_zero_target_row_gives_minus_one(fill):
    p = torch.full((1, N + 1, V), fill)
    q = torch.full((1, N, V), 0.2)
    for d in ([[0, 1]], [[-1, -1]]):
        for draft in (q, None):
            out, acc, emit = run(draft, torch.tensor(d), p, 5)
            assert out.tolist() == [[-1, -1, -1]] and emit.tolist() == [0] and acc.tolist() == [0]
    # Only the bonus row is empty: the drafts are accepted, then -1 in the bonus slot.
    p = torch.full((1, N + 1, V), 0.2)
    p[0, N] = fill
    out, acc, emit = run(q, torch.tensor([[0, 1]]), p, 5)
    assert out.tolist() == [[0, 1, -1]] and emit.tolist() == [2] and acc.tolist() == [2]


def test_dirty_requests_leave_others_untouched():
    g = torch.Generator().manual_seed(0)
    batch, vocab = 6, 50
    p = torch.softmax(torch.randn(batch, N + 1, vocab, generator=g), -1)
    q = torch.softmax(torch.randn(batch, N, vocab, generator=g), -1)
    d = torch.randint(0, vocab, (batch, N), generator=g)
    clean = run(q, d, p, seed=9)
    p2, q2, d2 = p.clone(), q.clone(), d.clone()
    dirty = [1, 4]
    p2[1] = float("nan")
    q2[1, 0] = -5.0
    d2[1] = torch.tensor([-3, vocab + 7])
    p2[4, :, ::2] = float("-inf")
    q2[4] = float("inf")
    d2[4, 1] = 2**40
    mixed = run(q2, d2, p2, seed=9)
    keep = [b for b in range(batch) if b not in dirty]
    for got, want in zip(mixed, clean):
        assert torch.equal(got[keep], want[keep])
    # The dirty rows still obey the output format.
    assert mixed[0][1].tolist() == [-1, -1, -1]
    assert ((mixed[0][4] >= -1) & (mixed[0][4] < vocab)).all()


# ----------------------------------------------------------------------------------------------
# Counters that share memory are refused on every backend, eagerly and at trace time


def aliased_counters(kind):
    """(accepted, emitted) sharing memory in the ways a caller might build them by accident."""
    if kind == "expand":  # stride 0: every request adds into one slot
        return torch.zeros(1, dtype=torch.int32).expand(B), torch.zeros(B, dtype=torch.int32)
    buf = torch.zeros(2 * B, dtype=torch.int32)
    if kind == "same":
        return buf[:B], buf[:B]
    if kind == "shifted":  # overlapping windows of one buffer
        return buf[:B], buf[1:B + 1]
    raise ValueError(kind)


ALIAS_CASES = [("expand", "stride 0"), ("same", "must not share memory"),
               ("shifted", "must not share memory")]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kind,fragment", ALIAS_CASES)
def test_aliased_counters_refused_eagerly(monkeypatch, backend, kind, fragment):
    monkeypatch.setenv("SPECOPS_BACKEND", backend)  # triton: the interpreter here
    args = good_args()
    acc, emit = aliased_counters(kind)
    before = acc.clone(), emit.clone()
    with pytest.raises(ValueError, match=f"^accepted_num .*{fragment}"):
        OP(args["draft_probs"], args["draft_token_ids"], args["target_probs"], acc, emit,
           args["seed"], args["offset"])
    # The public function names the arguments its caller passed.
    with pytest.raises(ValueError, match=f"^maybe_output_accepted_token_num .*{fragment}"):
        specops.chain_speculative_sampling(args["draft_probs"], args["draft_token_ids"],
                                           args["target_probs"], acc, emit, seed=1)
    assert torch.equal(acc, before[0]) and torch.equal(emit, before[1])  # refused before writing


@pytest.mark.parametrize("kind,fragment", ALIAS_CASES)
def test_aliased_counters_refused_at_trace_time(kind, fragment):
    args = good_args()
    acc, emit = aliased_counters(kind)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) if t is not None else None for t in
                (args["draft_probs"], args["draft_token_ids"], args["target_probs"], acc, emit,
                 args["seed"], args["offset"])]
        with pytest.raises(ValueError, match=fragment):
            OP(*fake)
        # The public function under a mode (not compiling) names its caller's arguments too.
        with pytest.raises(ValueError, match=f"^maybe_output_accepted_token_num .*{fragment}"):
            specops.chain_speculative_sampling(*fake[:5], seed=fake[5], offset=fake[6])
    chain = errors_while_tracing(_compiled_call, args["draft_probs"], args["draft_token_ids"],
                                 args["target_probs"], acc, emit, args["seed"], args["offset"])
    assert any(type(e) is ValueError and fragment in str(e) for e in chain), [repr(e) for e in chain]


@pytest.mark.parametrize("layout", ["padded", "flattened"])
@pytest.mark.parametrize("kind,fragment", ALIAS_CASES)
def test_aliased_counters_refused_from_logits_at_trace_time(layout, kind, fragment):
    """The ops from logits take no counters: the public functions, which add the counts to them,
    refuse counters that share memory under torch.compile too, naming their caller's arguments
    (a stride 0 in their own traced check, which Dynamo reports as an observed exception with the
    message; an overlap in the fake of the op that checks it)."""
    import specops.varlen

    args = good_args()
    logits, ids = args["target_probs"].log(), args["draft_token_ids"]

    def call(acc, emit):
        if layout == "padded":
            return specops.chain_speculative_sampling_from_logits(None, ids, logits, acc, emit,
                                                                  seed=1)
        return specops.varlen.chain_speculative_sampling_from_logits(
            None, ids.reshape(-1), logits.reshape(-1, V), torch.arange(B + 1) * N, N, acc, emit,
            seed=1)

    chain = errors_while_tracing(call, *aliased_counters(kind))
    assert any(fragment in str(e) and "maybe_output_accepted_token_num" in str(e)
               for e in chain), [repr(e) for e in chain]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("entry", ["logits", "probs", "flattened probs"])
def test_a_compiled_step_refuses_counters_that_overlap_on_a_later_call(backend, entry):
    """Compiled with separate counters, a step still refuses overlapping ones on a later call
    (Dynamo guards no storage overlap, so no new trace would see them, and the compiled probability
    op works on copies of its counters): the check runs in the compiled code, naming the caller's
    arguments."""
    import specops.varlen

    args = good_args()
    draft, ids, probs = args["draft_probs"], args["draft_token_ids"], args["target_probs"]

    def step(acc, emit):
        if entry == "logits":
            return specops.chain_speculative_sampling_from_logits(None, ids, probs.log(), acc,
                                                                  emit, seed=1)
        if entry == "probs":
            return specops.chain_speculative_sampling(draft, ids, probs, acc, emit, seed=1)
        return specops.varlen.chain_speculative_sampling(
            draft.reshape(-1, V), ids.reshape(-1), probs.reshape(-1, V),
            torch.arange(B + 1) * N, N, acc, emit, seed=1)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    separate = [torch.zeros(B, dtype=torch.int32) for _ in range(2)]
    eager = [torch.zeros(B, dtype=torch.int32) for _ in range(2)]
    assert all(map(torch.equal, compiled(*separate), step(*eager)))
    assert all(map(torch.equal, separate, eager))
    buf = torch.zeros(B + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="^maybe_output_accepted_token_num .*must not share"):
        compiled(buf[:B], buf[1:])


@pytest.mark.parametrize("case", ["chain, 0-D target", "chain, ids a list", "tree, 1-D target",
                                  "tree from logits, 0-D target"])
def test_a_target_of_another_rank_or_a_list_is_named_under_compile_too(case):
    """The argument checks' one boolean pass raises nothing of its own (Dynamo hands no exception
    raised there to an except clause): under torch.compile the caller sees the eager error, not
    an IndexError or AttributeError from inside the check."""
    ids, parents = torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, 1, dtype=torch.int64)
    call, argument = {
        "chain, 0-D target": (lambda: specops.chain_speculative_sampling(
            None, ids, torch.tensor(0.5), seed=1), "target_probs"),
        "chain, ids a list": (lambda: specops.chain_speculative_sampling(
            None, [[0]], torch.rand(1, 2, 3), seed=1), "draft_token_ids"),
        "tree, 1-D target": (lambda: specops.tree_speculative_sampling(
            None, ids, parents, torch.rand(3), seed=1), "target_probs"),
        "tree from logits, 0-D target": (lambda: specops.tree_speculative_sampling_from_logits(
            None, ids, parents, torch.tensor(0.5), seed=1), "target_logits"),
    }[case]
    with pytest.raises((ValueError, TypeError)) as eager:
        call()
    assert str(eager.value).startswith(argument)
    chain = errors_while_tracing(call)
    assert any(str(eager.value) in str(e) for e in chain), [repr(e) for e in chain]


def test_counters_in_one_buffer_without_overlap_are_fine():
    # Columns of one (B, 2) buffer, and halves of one buffer: no element shared, so allowed.
    args = good_args()
    q, d, p = args["draft_probs"], args["draft_token_ids"], args["target_probs"]
    ref = specops.chain_speculative_sampling(q, d, p, seed=4)
    columns = torch.zeros(B, 2, dtype=torch.int32)
    halves = torch.zeros(2 * B, dtype=torch.int32)
    for acc, emit in ((columns[:, 0], columns[:, 1]), (halves[:B], halves[B:])):
        out = specops.chain_speculative_sampling(q, d, p, acc, emit, seed=4)
        assert torch.equal(out[0], ref[0])
        assert torch.equal(acc, ref[1]) and torch.equal(emit, ref[2])


# ----------------------------------------------------------------------------------------------
# Errors that name what the caller did


def test_registered_op_with_none_counters():
    args = good_args()
    for name in ("accepted_num", "emitted_num"):
        bad = dict(args)
        bad[name] = None
        with pytest.raises(TypeError, match=f"^{name} must be a tensor; got NoneType"):
            OP(*[bad[k] for k in ARG_ORDER])


def test_target_with_n_positions_blames_the_mismatch():
    # target_probs (B, N, V) with draft_token_ids (B, N): target_probs lacks the bonus row.
    args = good_args()
    with pytest.raises(ValueError) as info:
        specops.chain_speculative_sampling(None, args["draft_token_ids"],
                                           args["target_probs"][:, :N], seed=0)
    message = str(info.value)
    assert "disagree on the number of draft tokens" in message
    assert f"target_probs needs {N} + 1 = {N + 1} positions" in message
    assert f"implies draft_token_ids of shape (batch_size, num_speculate_tokens) = ({B}, {N - 1})" \
        in message


def test_public_function_names_its_own_counter_arguments():
    args = good_args()
    q, d, p = args["draft_probs"], args["draft_token_ids"], args["target_probs"]
    cases = [
        ((torch.zeros(B + 1, dtype=torch.int32), None), ValueError,
         r"^maybe_output_accepted_token_num must have shape \(batch_size,\) = \(3,\); got \(4,\)"),
        ((None, torch.zeros(B)), TypeError,
         "^maybe_output_emitted_draft_token_num must have dtype int32 or int64; got float32"),
        ((torch.zeros(B, dtype=torch.int32).to("meta"), None), ValueError,
         r"^maybe_output_accepted_token_num must be on the same device as target_probs"),
    ]
    for (acc, emit), exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            specops.chain_speculative_sampling(q, d, p, acc, emit, seed=0)


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("Yes", True), ("on", True),
                                      ("0", False), ("false", False), ("no", False),
                                      ("OFF", False), ("", False)])
def test_validate_mode_spellings(monkeypatch, value, on):
    args = good_args()
    d = args["draft_token_ids"].clone()
    d[0, 0] = -7  # refused only when validating
    monkeypatch.setenv("SPECOPS_VALIDATE", value)
    if on:
        with pytest.raises(ValueError, match="SPECOPS_VALIDATE"):
            validate_call(args["draft_probs"], d, args["target_probs"])
    else:
        validate_call(args["draft_probs"], d, args["target_probs"])


def test_validate_mode_refuses_a_spelling_it_does_not_know(monkeypatch):
    args = good_args()
    monkeypatch.setenv("SPECOPS_VALIDATE", "maybe")
    with pytest.raises(ValueError, match="SPECOPS_VALIDATE must be one of .*got 'maybe'"):
        validate_call(args["draft_probs"], args["draft_token_ids"], args["target_probs"])


def test_generator_of_another_type_is_named():
    args = good_args()
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None; got str"):
        specops.chain_speculative_sampling(args["draft_probs"], args["draft_token_ids"],
                                           args["target_probs"], generator="x")


def test_numpy_integer_seeds_are_ints():
    np = pytest.importorskip("numpy")
    from inputs import softmax_inputs

    q, d, p = softmax_inputs(batch=8, vocab=50)
    assert not torch.equal(specops.chain_speculative_sampling(q, d, p, seed=3)[0],
                           specops.chain_speculative_sampling(q, d, p, seed=4)[0])
    expected = specops.chain_speculative_sampling(q, d, p, seed=3, offset=5)[0]
    got = specops.chain_speculative_sampling(q, d, p, seed=np.int64(3), offset=np.uint32(5))[0]
    assert torch.equal(got, expected)
    with pytest.raises(TypeError, match="seed must be an int or an int64 tensor; got float"):
        specops.chain_speculative_sampling(q, d, p, seed=3.0)


@pytest.mark.parametrize("changes,fragment", [
    (dict(verification="blok"), "verification must be one of token, block, tree, traversal; got 'blok'"),
    (dict(verification=("token", "trees")), "verification must be one of token, block, tree"),
    (dict(parents_dtype=torch.uint8), "parents_dtype must be one of int32, int64"),
    (dict(dtype=torch.float64), "dtype must be one of float32, float16, bfloat16"),
    (dict(vocab=0), "vocab must be an int >= 1; got 0"),
    (dict(num_draft=range(-1, 3)), "num_draft must be an int >= 0; got -1"),
    (dict(ids_dtype=torch.int16), "ids_dtype must be one of int32, int64"),
    (dict(counter_dtype=torch.float32), "counter_dtype must be one of int32, int64"),
    (dict(draft_probs="yes"), "draft_probs must be one of True, False; got 'yes'"),
    (dict(logits=True, penalties=(False, "on")), "penalties must be one of True, False; got 'on'"),
])
def test_warmup_refuses_settings_no_call_can_have_on_every_device(changes, fragment):
    # On a CPU warmup loads nothing, but a typo must not pass silently there and fail on a GPU.
    args = dict(device="cpu", vocab=32000, num_draft=3)
    args.update(changes)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        specops.warmup(**args)
    assert specops.warmup("cpu", 32000, range(1, 4), verification=("token", "block", "tree")) == 0
