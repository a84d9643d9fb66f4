"""specops.varlen: a flattened batch gets, request by request, exactly the tokens and counts of
the padded batch it stands for (its drafts padded with -1 to any width, the rows past them any
values), both verifications, from probabilities and from logits with every sampling parameter;
the layout's checks; no padded copy on the Triton path; the op's registration and tracing."""

from __future__ import annotations

import os

import pytest
import torch
from inputs import DEVICE, Allocations  # tests/inputs.py; on CPU, conftest.py: TRITON_INTERPRET=1

import specops
import specops.varlen
from specops.varlen import op as varlen_op

COUNTS = [2, 0, 3, 1, 3]  # N_b, with a request of no drafts
MOST = 3


def flattened(counts, vocab, *, seed=0, dtype=torch.float32, device="cpu"):
    """(draft rows (T, V), ids (T,), target rows (T + B, V), cu (B + 1,), target logits,
    draft logits): peaked rows, drafts drawn from draft rows that half follow the target."""
    g = torch.Generator().manual_seed(seed)
    batch, num_tokens = len(counts), sum(counts)
    target_logits = 3 * torch.randn(num_tokens + batch, vocab, generator=g)
    draft_logits = 3 * torch.randn(num_tokens, vocab, generator=g)
    target = target_logits.softmax(-1)
    # Request b's draft row j sits at cu[b] + j; its target row j at cu[b] + b + j.
    cu = torch.tensor([0] + counts).cumsum(0)
    own_target = torch.cat([torch.arange(cu[b] + b, cu[b + 1] + b) for b in range(batch)])
    draft = 0.5 * draft_logits.softmax(-1) + 0.5 * target[own_target]
    ids = torch.multinomial(draft, 1, generator=g).reshape(-1)
    cast = dict(device=device)
    return (draft.to(dtype).to(**cast), ids.to(**cast), target.to(dtype).to(**cast),
            cu.to(**cast), target_logits.to(dtype).to(**cast), draft_logits.to(dtype).to(**cast))


def padded(draft, ids, target, counts, width, seed=1):
    """The padded batch of width ``width`` >= max N_b: ids -1 past each request's drafts, random
    rows (never read) in the padding."""
    g = torch.Generator().manual_seed(seed)
    batch, vocab = len(counts), target.shape[1]
    junk = torch.rand(batch, width + 1, vocab, generator=g).to(target.dtype)
    target_p, draft_p = junk.clone(), (None if draft is None else junk[:, :width].clone())
    ids_p = torch.full((batch, width), -1, dtype=ids.dtype)
    start = 0
    for b, n in enumerate(counts):
        target_p[b, : n + 1] = target[start + b: start + b + n + 1]
        if draft is not None:
            draft_p[b, :n] = draft[start: start + n]
        ids_p[b, :n] = ids[start: start + n]
        start += n
    return draft_p, ids_p, target_p


# (name, how the flattened call and the padded call are made): probabilities, one-hot drafts,
# and from logits with per-request parameters (greedy and top-k, top-p, min-p requests).
PARAMETERS = dict(temperature=torch.tensor([0.7, 1.0, 0.0, 1.3, 1.0]),
                  top_k=torch.tensor([0, 5, 0, 50, 3]),
                  top_p=torch.tensor([0.9, 1.0, 1.0, 0.8, 1.0]),
                  min_p=torch.tensor([0.0, 0.0, 0.0, 0.05, 0.1]))
MODES = ["probabilities", "one-hot", "logits", "draft logits"]


def call(mode, function_set, draft, ids, target, target_logits, draft_logits, *layout,
         parameters=PARAMETERS, **kwargs):
    """``function_set``'s (specops or specops.varlen) call of ``mode`` on the given rows."""
    if mode == "probabilities":
        return function_set.chain_speculative_sampling(draft, ids, target, *layout, **kwargs)
    if mode == "one-hot":
        return function_set.chain_speculative_sampling(None, ids, target, *layout, **kwargs)
    return function_set.chain_speculative_sampling_from_logits(
        None, ids, target_logits, *layout, **parameters,
        draft_logits=draft_logits if mode == "draft logits" else None, **kwargs)


def counters(batch):
    """Counters that start apart from zero: the op adds to them."""
    return torch.arange(batch, dtype=torch.int32) * 3, torch.arange(batch, dtype=torch.int32) + 7


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("mode", MODES)
def test_each_request_gets_the_padded_batchs_tokens(verification, mode):
    """One seed for the batch (request b draws from its stream b): the padded batch of any width,
    its padding random, gives every request the same tokens and counts."""
    draft, ids, target, cu, logits, draft_logits = flattened(COUNTS, 40, seed=3)
    batch = len(COUNTS)
    for seed in range(6):
        acc, emit = counters(batch)
        out = call(mode, specops.varlen, draft, ids, target, logits, draft_logits, cu, MOST, acc,
                   emit, seed=seed, offset=5, verification=verification)[0]
        assert out.shape == (batch, MOST + 1)
        for width in (MOST, MOST + 2):
            rows = padded(draft, ids, target, COUNTS, width, seed=seed)
            _, _, logits_p = padded(None, ids, logits, COUNTS, width, seed=seed)
            draft_logits_p = padded(draft_logits, ids, target, COUNTS, width, seed=seed)[0]
            acc_p, emit_p = counters(batch)
            out_p = call(mode, specops, *rows, logits_p, draft_logits_p, acc_p, emit_p,
                         seed=seed, offset=5, verification=verification)[0]
            torch.testing.assert_close(out, out_p[:, : MOST + 1], rtol=0, atol=0)
            assert (out_p[:, MOST + 1:] == -1).all()
            torch.testing.assert_close((acc, emit), (acc_p, emit_p), rtol=0, atol=0)


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("mode", ["probabilities", "draft logits"])
def test_per_request_seeds_give_each_request_its_own_call(verification, mode):
    """Per-request seeds and offsets: request b alone, padded to its own length (N_b = 0
    included), gets what the flattened batch gives it."""
    draft, ids, target, cu, logits, draft_logits = flattened(COUNTS, 40, seed=4)
    batch = len(COUNTS)
    seeds, offsets = torch.arange(batch) * 7919 - 3, torch.arange(batch) + 11
    out, acc, emit = call(mode, specops.varlen, draft, ids, target, logits, draft_logits, cu,
                          MOST, seed=seeds, offset=offsets, verification=verification)
    for b, n in enumerate(COUNTS):
        one = [n]
        start = int(cu[b])
        rows = padded(None if draft is None else draft[start: start + n], ids[start: start + n],
                      target[start + b: start + b + n + 1], one, n)
        logits_p = padded(None, ids[start: start + n], logits[start + b: start + b + n + 1],
                          one, n)[2]
        draft_logits_p = padded(draft_logits[start: start + n], ids[start: start + n],
                                logits[start + b: start + b + n + 1], one, n)[0]
        parameters = {name: value[b: b + 1] for name, value in PARAMETERS.items()}
        out_b, acc_b, emit_b = call(mode, specops, *rows, logits_p, draft_logits_p,
                                    parameters=parameters, seed=seeds[b: b + 1],
                                    offset=offsets[b: b + 1], verification=verification)
        assert out[b, : n + 1].tolist() == out_b[0].tolist()
        assert (out[b, n + 1:] == -1).all()
        assert (acc[b], emit[b]) == (acc_b[0], emit_b[0])


def test_a_batch_without_drafts_draws_one_token_a_request():
    """T = 0 (every N_b = 0): each request's single row gives its token."""
    target = torch.eye(6)[[4, 1, 3]]
    cu = torch.zeros(4, dtype=torch.int64)
    for verification in ("token", "block"):
        out, acc, emit = specops.varlen.chain_speculative_sampling(
            torch.empty(0, 6), torch.empty(0, dtype=torch.int64), target, cu, 2, seed=1,
            verification=verification)
        assert out.tolist() == [[4, -1, -1], [1, -1, -1], [3, -1, -1]]
        assert acc.tolist() == emit.tolist() == [0, 0, 0]


# Layouts the shapes alone refuse (no device read): (what changes, the error's words).
def _arguments(draft, ids, target, cu):
    return dict(draft_probs=draft, draft_token_ids=ids, target_probs=target,
                cu_num_draft_tokens=cu, max_num_draft_tokens=MOST)


SHAPE_ERRORS = [
    (lambda a: a.update(target_probs=a["target_probs"][:-1]), "target_probs must have "
     "num_tokens + batch_size = 9 + 5 = 14 rows"),
    (lambda a: a.update(cu_num_draft_tokens=a["cu_num_draft_tokens"][:-1]),
     "target_probs must have num_tokens + batch_size = 9 + 4 = 13 rows"),
    (lambda a: a.update(cu_num_draft_tokens=a["cu_num_draft_tokens"][None]),
     "cu_num_draft_tokens must be 1-D"),
    (lambda a: a.update(cu_num_draft_tokens=a["cu_num_draft_tokens"].float()),
     "cu_num_draft_tokens must have dtype"),
    (lambda a: a.update(max_num_draft_tokens=1), "more than batch_size * max_num_draft_tokens"),
    (lambda a: a.update(max_num_draft_tokens=-1), "max_num_draft_tokens must be an int >= 0"),
    (lambda a: a.update(max_num_draft_tokens=2.0), "max_num_draft_tokens must be an int >= 0"),
    (lambda a: a.update(draft_probs=a["draft_probs"][:-1]), "draft_probs must have shape "
     "(num_tokens, vocab_size) = (9, 40)"),
    (lambda a: a.update(draft_token_ids=a["draft_token_ids"][:, None]),
     "draft_token_ids must be 1-D"),
]


@pytest.mark.parametrize("change, message", SHAPE_ERRORS)
def test_bad_shapes_are_refused_naming_the_argument(change, message):
    draft, ids, target, cu, _, _ = flattened(COUNTS, 40)
    arguments = _arguments(draft, ids, target, cu)
    change(arguments)
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(
            ")", r"\)").replace("*", r"\*").replace("+", r"\+")):
        specops.varlen.chain_speculative_sampling(**arguments)


# Layouts only their values show: refused under SPECOPS_VALIDATE=1.
VALUE_ERRORS = [
    ([1, 2, 2, 5, 6, 9], "must start at 0"),
    ([0, 3, 2, 5, 6, 9], "must not decrease"),
    ([0, 2, 2, 5, 6, 8], "must end at num_tokens = 9"),
    ([0, 0, 0, 4, 5, 9], "request 2 has 4 drafts"),
]


@pytest.mark.parametrize("cu, message", VALUE_ERRORS)
def test_bad_layouts_are_refused_under_validation(cu, message, monkeypatch):
    draft, ids, target, _, logits, _ = flattened(COUNTS, 40)
    cu = torch.tensor(cu)
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    with pytest.raises(ValueError, match=message):
        specops.varlen.chain_speculative_sampling(draft, ids, target, cu, MOST)
    with pytest.raises(ValueError, match=message):
        specops.varlen.chain_speculative_sampling_from_logits(None, ids, logits, cu, MOST,
                                                             top_p=0.9, verification="block")


def test_rows_far_from_one_are_refused_where_read_under_validation(monkeypatch):
    draft, ids, target, cu, logits, _ = flattened(COUNTS, 40)
    ids[3] = -1  # request 2 (drafts 2..4, target rows 4..7) ends after its first draft
    target[7] *= 3  # read by no request: past request 2's end
    draft[4] *= 3
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    specops.varlen.chain_speculative_sampling(draft, ids, target, cu, MOST)
    for rows, index, name in ((target, 5, "target_probs"), (draft, 2, "draft_probs")):
        bad = rows.clone()
        bad[index] *= 2
        given = {"draft_probs": draft, "target_probs": target, name: bad}
        with pytest.raises(ValueError, match=rf"{name} must hold probability rows.*\({index},\)"):
            specops.varlen.chain_speculative_sampling(given["draft_probs"], ids,
                                                      given["target_probs"], cu, MOST)
    with pytest.raises(ValueError, match="draft_probs must hold probability rows"):
        specops.varlen.chain_speculative_sampling_from_logits(2 * draft, ids, logits, cu, MOST)


def _with_backend(backend, function, *args, **kwargs):
    previous = os.environ.get("SPECOPS_BACKEND")
    os.environ["SPECOPS_BACKEND"] = backend
    try:
        return function(*args, **kwargs)
    finally:
        if previous is None:
            del os.environ["SPECOPS_BACKEND"]
        else:
            os.environ["SPECOPS_BACKEND"] = previous


# A bad cu[0] touches request 0 only, a bad cu[B] the last request only: the others keep their
# tokens. (Any other entry is shared by two requests.)
BAD_ENDS = [(0, -3), (0, 4), (-1, 40), (-1, 2)]


def _bad_layout_runs(backends):
    draft, ids, target, cu, _, _ = flattened(COUNTS, 300, seed=5, device=DEVICE)
    for verification in ("token", "block"):
        good = specops.varlen.chain_speculative_sampling(draft, ids, target, cu, MOST, seed=3,
                                                         verification=verification)[0]
        for where, value in BAD_ENDS:
            bad = cu.clone()
            bad[where] = value
            outs = [_with_backend(backend, specops.varlen.chain_speculative_sampling, draft, ids,
                                  target, bad, MOST, seed=3, verification=verification)[0]
                    for backend in backends]
            for out in outs:
                kept = slice(1, None) if where == 0 else slice(None, -1)
                torch.testing.assert_close(out[kept], good[kept], rtol=0, atol=0)
                assert ((out >= -1) & (out < 300)).all()
            for out in outs[1:]:
                torch.testing.assert_close(out, outs[0], rtol=0, atol=0)


def test_a_bad_layout_unvalidated_changes_no_other_request():
    _bad_layout_runs(["torch"])


@pytest.mark.interpreter
def test_a_bad_layout_unvalidated_reads_in_bounds_on_the_triton_path():
    """The kernels clamp the layout as the reference does: the same tokens, no read outside the
    tensors (under the interpreter an out-of-bounds read fails the run)."""
    _bad_layout_runs(["torch", "triton"])


@pytest.mark.interpreter
@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("mode, dtype", [("probabilities", torch.float32),
                                         ("one-hot", torch.bfloat16),
                                         ("draft logits", torch.float16)])
def test_triton_path_matches_the_reference(verification, mode, dtype):
    """The kernels on the flattened rows against the reference on the padded batch, token for
    token; rows of probabilities over a chunk (1024), so that they span chunks (from logits, the
    interpreter's threshold searches make a row slow: one chunk)."""
    _triton_against_reference(verification, mode, dtype,
                              1100 if mode in ("probabilities", "one-hot") else 300)


def _triton_against_reference(verification, mode, dtype, vocab):
    inputs = flattened(COUNTS, vocab, seed=6, dtype=dtype, device=DEVICE)
    parameters = {name: value.to(DEVICE) for name, value in PARAMETERS.items()}
    results = []
    for backend in ("torch", "triton"):
        acc, emit = (c.to(DEVICE) for c in counters(len(COUNTS)))
        out = _with_backend(backend, call, mode, specops.varlen, *inputs[:3], *inputs[4:],
                            inputs[3], MOST, acc, emit, parameters=parameters, seed=9,
                            offset=2, verification=verification)[0]
        results.append((out, acc, emit))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)


@pytest.mark.interpreter
@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("mode", ["probabilities", "draft logits"])
def test_the_triton_path_makes_no_padded_copy(verification, mode):
    """No tensor of the padded batch's size, or bigger than a few rows, is made: the rows are
    read where they are."""
    inputs = flattened(COUNTS, 1100, seed=7, device=DEVICE)
    batch, vocab = len(COUNTS), 1100
    # Temperatures alone: the statistics' threshold searches are slow under the interpreter.
    parameters = dict(PARAMETERS, top_k=None, top_p=None, min_p=None)
    parameters["temperature"] = parameters["temperature"].to(DEVICE)
    with Allocations() as seen:
        _with_backend("triton", call, mode, specops.varlen, *inputs[:3], *inputs[4:], inputs[3],
                      MOST, parameters=parameters, seed=1, verification=verification)
    shapes = [shape for shape, _ in seen.made]
    largest = max(torch.Size(s).numel() for s in shapes)
    assert largest < 2 * vocab, sorted(shapes, key=lambda s: -torch.Size(s).numel())[:3]
    assert (batch, MOST + 1, vocab) not in shapes


OPS = [(varlen_op.varlen_chain_speculative_sampling_op, False),
       (varlen_op.varlen_chain_block_speculative_sampling_op, False),
       (varlen_op.varlen_chain_speculative_sampling_from_logits_op, True),
       (varlen_op.varlen_chain_block_speculative_sampling_from_logits_op, True)]


def _op_arguments(logits, cu=None):
    draft, ids, target, cu_, target_logits, draft_logits = flattened(COUNTS, 40, seed=8)
    cu = cu_ if cu is None else cu
    seed, offset = torch.tensor([5]), torch.tensor([1])
    if logits:
        return (None, ids, target_logits, cu, MOST, draft_logits, seed, offset,
                *PARAMETERS.values())
    return (draft, ids, target, cu, MOST, *counters(len(COUNTS)), seed, offset)


@pytest.mark.parametrize("op, logits", OPS)
def test_opcheck(op, logits):
    torch.library.opcheck(op, _op_arguments(logits))
    if logits:  # with the draft's own parameters
        torch.library.opcheck(op, (*_op_arguments(logits), torch.tensor([0.5]),
                                   torch.tensor([4]), None, None))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("op, logits", OPS[::3])
def test_compiled_fullgraph_equals_eager_for_every_mix_of_lengths(op, logits, backend):
    """One graph serves every mix of lengths (cu's values are data, the width an int)."""
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    step = torch.compile(lambda *args: op(*args), fullgraph=True,
                         backend=counting if backend == "aot_eager" else backend)
    for cu in (None, torch.tensor([0, 3, 3, 3, 6, 9]), torch.tensor([0, 0, 3, 5, 8, 9])):
        eager_args, compiled_args = _op_arguments(logits, cu), _op_arguments(logits, cu)
        torch.testing.assert_close(step(*compiled_args), op(*eager_args), rtol=0, atol=0)
        if not logits:  # the counters, added to in place (the ops from logits return theirs)
            torch.testing.assert_close(compiled_args[5:7], eager_args[5:7], rtol=0, atol=0)
    if backend == "aot_eager":
        assert len(compiles) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("mode", MODES)
def test_the_kernels_match_the_reference_on_the_gpu(verification, mode):
    """The flattened kernels on a GPU, at a vocabulary of many chunks, against the reference."""
    _triton_against_reference(verification, mode, torch.bfloat16, 32000)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("verification", ["token", "block"])
def test_cuda_graph_replay_follows_new_layouts(verification):
    """Captured once, replayed on new drafts and a new layout of the same sizes: the eager
    call's tokens."""
    from graphs import capture, warm_up  # tests/graphs.py

    inputs = [t.clone() for t in flattened(COUNTS, 3000, seed=9, device="cuda")]
    draft, ids, target, cu = inputs[:4]
    seed, offset = torch.tensor([4], device="cuda"), torch.tensor([0], device="cuda")

    def step():
        return specops.varlen.chain_speculative_sampling(draft, ids, target, cu, MOST, seed=seed,
                                                         offset=offset,
                                                         verification=verification)[0]
    warm_up(step)
    graph, out = capture(step)
    new = flattened([3, 3, 0, 2, 1], 3000, seed=10, device="cuda")
    for t, value in zip((draft, ids, target, cu), new[:4]):
        t.copy_(value)
    graph.replay()
    torch.testing.assert_close(out, step(), rtol=0, atol=0)


@pytest.mark.parametrize("op, logits", OPS[::3])
@pytest.mark.parametrize("bad", ["target rows", "max"])
def test_bad_shapes_raise_the_same_error_at_trace_time(op, logits, bad):
    """The op's fake checks as its kernel does: the eager error, under fake tensors and inside
    torch.compile (fullgraph)."""
    from tracing import (assert_same_error_under_compile,  # tests/tracing.py
                         assert_same_error_under_fake_tensors, message_of)

    args = list(_op_arguments(logits))
    if bad == "target rows":
        args[2] = args[2][:-1]
    else:
        args[4] = 1  # fewer than the longest request's 3 drafts
    message = message_of(ValueError, op, *args)
    assert ("target_probs" if not logits else "target_logits") in message or \
        "max_num_draft_tokens" in message
    assert_same_error_under_fake_tensors(op, args, ValueError, message)
    assert_same_error_under_compile(op, args, ValueError, message)
