"""Property-based test (hypothesis): the invariants of docs/token.md on arbitrary, partly dirty input."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specops

# Deterministic: the same examples on every run, no example database.
settings.register_profile(
    "specops-deterministic",
    derandomize=True,
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

PROB_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DIRT = ["zero_row", "nan", "neg", "inf", "bad_ids", "zero_target", "neg_row", "nan_row"]


@st.composite
def cases(draw):
    batch = draw(st.integers(1, 5))
    num_draft = draw(st.integers(1, 4))
    vocab = draw(st.sampled_from([1, 2, 3, 7, 33, 1024, 1025, 2100]))
    return dict(
        batch=batch,
        num_draft=num_draft,
        vocab=vocab,
        dtype=draw(st.sampled_from(PROB_DTYPES)),
        id_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        counter_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        with_draft=draw(st.booleans()),
        per_request_seed=draw(st.booleans()),
        sparsity=draw(st.sampled_from([0.0, 0.5, 0.99])),
        data_seed=draw(st.integers(0, 2**32 - 1)),
        seed=draw(st.integers(-(2**63), 2**63 - 1)),
        offset=draw(st.integers(0, 2**63 - 1)),
        # Which requests are dirty, and how; request 0 is always clean.
        dirt=[draw(st.lists(st.sampled_from(DIRT), max_size=3, unique=True)) for _ in range(batch - 1)],
    )


def build(case):
    rng = np.random.default_rng(case["data_seed"])
    b, n, v = case["batch"], case["num_draft"], case["vocab"]
    p = rng.random((b, n + 1, v)) * (rng.random((b, n + 1, v)) >= case["sparsity"])
    q = rng.random((b, n, v)) * (rng.random((b, n, v)) >= case["sparsity"])
    p /= np.maximum(p.sum(-1, keepdims=True), 1e-30)
    q /= np.maximum(q.sum(-1, keepdims=True), 1e-30)
    # Drafts mostly from q's support (so acceptance happens), sometimes arbitrary.
    d = np.where(
        rng.random((b, n)) < 0.8,
        np.argmax(q.cumsum(-1) > rng.random((b, n, 1)), axis=-1),
        rng.integers(0, v, (b, n)),
    )
    clean = (p.copy(), q.copy(), d.copy())
    for r, kinds in enumerate(case["dirt"], start=1):
        for kind in kinds:
            mask_p = rng.random((n + 1, v)) < 0.3
            mask_q = rng.random((n, v)) < 0.3
            if kind == "zero_row":
                p[r, rng.integers(0, n + 1)] = 0.0
                q[r, rng.integers(0, n)] = 0.0
            elif kind == "nan":
                p[r][mask_p] = np.nan
                q[r][mask_q] = np.nan
                p[r, np.arange(n), np.clip(d[r], 0, v - 1)] = np.nan  # also right at the drafts
            elif kind == "neg":
                p[r][mask_p] = -rng.random(mask_p.sum())
                q[r][mask_q] = -rng.random(mask_q.sum())
            elif kind == "inf":
                p[r][mask_p] = np.inf
                q[r][mask_q] = -np.inf
            elif kind == "bad_ids":
                d[r] = rng.choice([-1, -2, -(2**31), v, v + 5, 2**31 - 1], size=n)
            elif kind == "zero_target":
                p[r] = 0.0
            elif kind == "neg_row":  # a whole row negative: no mass at all
                j = rng.integers(0, 2)
                p[r, j] = -rng.random(v)
                q[r, min(j, n - 1)] = -rng.random(v)
            elif kind == "nan_row":
                p[r, rng.integers(0, n + 1)] = np.nan
    return clean, (p, q, d)


def to_torch(case, p, q, d):
    dtype = case["dtype"]
    return (
        torch.from_numpy(q).to(dtype) if case["with_draft"] else None,
        torch.from_numpy(d).to(case["id_dtype"]),
        torch.from_numpy(p).to(dtype),
    )


def sanitized(x: torch.Tensor) -> torch.Tensor:
    return x.float().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)


def call(case, q, d, p, acc, emit):
    if case["per_request_seed"]:
        b = case["batch"]
        # Distinct per-request seeds derived from the drawn one (wrapping in int64).
        seeds = torch.tensor([case["seed"]]) + torch.arange(b) * 0x9E3779B97F4A7C15
        return specops.chain_speculative_sampling(q, d, p, acc, emit, seed=seeds, offset=case["offset"])
    return specops.chain_speculative_sampling(q, d, p, acc, emit, seed=case["seed"], offset=case["offset"])


@settings(settings.get_profile("specops-deterministic"))
@given(case=cases())
def test_invariants(case):
    b, n, v = case["batch"], case["num_draft"], case["vocab"]
    clean_np, dirty_np = build(case)
    q, d, p = to_torch(case, *dirty_np)
    start_acc = torch.arange(b, dtype=case["counter_dtype"]) * 3 - 2
    start_emit = torch.arange(b, dtype=case["counter_dtype"]) * 5 + 1
    acc, emit = start_acc.clone(), start_emit.clone()
    out, acc_out, emit_out = call(case, q, d, p, acc, emit)
    assert acc_out is acc and emit_out is emit
    assert out.shape == (b, n + 1) and out.dtype == torch.int32
    accepted = (acc - start_acc).long()
    emitted = (emit - start_emit).long()

    ps = sanitized(p)
    qs = sanitized(q) if q is not None else None
    ids = d.long()
    valid = (ids >= 0) & (ids < v)
    for r in range(b):
        e = int(emitted[r])
        assert 0 <= e <= n
        # Accepted prefix = the drafts; each was valid with positive target probability.
        assert out[r, :e].tolist() == ids[r, :e].tolist()
        for j in range(e):
            assert valid[r, j] and ps[r, j, ids[r, j]] > 0
        # Then one token in [-1, V), then -1.
        token = int(out[r, e])
        assert -1 <= token < v
        assert (out[r, e + 1 :] == -1).all()
        # accepted counts every position's own coin: at least the e accepted ones, at most the
        # valid positions with p > 0.
        possible = int((valid[r] & (ps[r, :n].gather(1, ids[r].clamp(0, v - 1)[:, None])[:, 0] > 0)).sum())
        assert e <= int(accepted[r]) <= possible
        # The token at e has positive probability under the distribution it was drawn from.
        row = ps[r, e]
        if e < n and valid[r, e]:
            if qs is not None:
                residual = (row - qs[r, e]).clamp_min(0)
            else:
                residual = row.clone()
                residual[ids[r, e]] = 0
        else:
            residual = row
        if token == -1:
            assert not (row > 0).any()  # -1 only when the fallback p_e is empty
        elif (residual > 0).any():
            assert residual[token] > 0
        else:
            assert row[token] > 0

    # Request 0 is always clean; the other clean requests too. Their outputs must not depend on
    # the dirty neighbours: compare with the call on the all-clean batch (same rows, same seeds).
    dirty_rows = [r for r, kinds in enumerate(case["dirt"], start=1) if kinds]
    if dirty_rows:
        qc, dc, pc = to_torch(case, *clean_np)
        acc_c, emit_c = start_acc.clone(), start_emit.clone()
        out_c, _, _ = call(case, qc, dc, pc, acc_c, emit_c)
        keep = [r for r in range(b) if r not in dirty_rows]
        assert torch.equal(out[keep], out_c[keep])
        assert torch.equal(acc[keep], acc_c[keep]) and torch.equal(emit[keep], emit_c[keep])
        if case["per_request_seed"]:
            # Batch invariance: request 0 alone gives the same as in the dirty batch.
            seed0 = torch.tensor([case["seed"]])
            out0, _, _ = specops.chain_speculative_sampling(
                None if qc is None else qc[:1], dc[:1], pc[:1], seed=seed0, offset=case["offset"]
            )
            assert torch.equal(out0[0], out[0])
