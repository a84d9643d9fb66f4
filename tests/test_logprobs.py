"""Logprobs (docs/semantics.md, "Logprobs"): the log-probability of each output token under its
position's processed distribution (the ``log_softmax`` of the kept tokens' logits / T, as the
rule keeps them), or of the raw logits, and the most likely tokens; the same from every layout
(chain, flattened batch, tree) and every backend (CPU, Triton under the interpreter); the
arguments checked by name; the op passes opcheck and traces."""

from __future__ import annotations

import pytest
import torch

import specops
import specops.varlen
from specops.core.logits import rule
from specops.core.logprobs.launch import token_logprobs_triton
from specops.core.logprobs.op import token_logprobs_op
from specops.core.logprobs.rule import logprob_rows, token_logprobs_reference

B, N, V = 4, 3, 70
PARAMETERS = dict(temperature=torch.tensor([0.0, 1.0, 0.7, 1.2]), top_k=torch.tensor([0, 0, 5, 0]),
                  top_p=torch.tensor([1.0, 0.9, 1.0, 1.0]), min_p=torch.tensor([0.0, 0.0, 0.0, 0.1]))


def expected_rows(logits, temperature, top_k, top_p, min_p, min_p_last=False):
    """float64 (R, V): the log_softmax of x / T over the tokens the rule keeps (greedy rows: 0 at
    their token), -inf elsewhere; for logits whose kept weights do not underflow."""
    kept = rule.processed_rows(logits, temperature, top_k, top_p, min_p, min_p_last) > 0
    greedy = (temperature == 0)[:, None]
    x = logits.double() / torch.where(greedy, 1.0, temperature.double()[:, None])
    sampled = torch.log_softmax(torch.where(kept, x, -torch.inf), dim=-1)
    return torch.where(kept, torch.where(greedy, 0.0, sampled), -torch.inf)


def assert_close_logprobs(got, expected, atol=2e-6):
    assert torch.equal(got.isinf(), expected.isinf())
    finite = ~expected.isinf()
    assert (got[finite].double() - expected[finite]).abs().max() < atol


def rows_inputs(seed=0, rows=12, vocab=V):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(rows, vocab, generator=g)
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.5, 2.0, 0.5] * (rows // 6))
    top_k = torch.tensor([0, 0, 5, 0, 20, 3] * (rows // 6))
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.8, 0.9, 1.0] * (rows // 6))
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.2] * (rows // 6))
    return logits, (temperature, top_k, top_p, min_p)


@pytest.mark.parametrize("min_p_last", [False, True])
def test_rows_are_the_log_softmax_of_the_kept_tokens(min_p_last):
    logits, params = rows_inputs()
    got = logprob_rows(logits, *params, min_p_last=min_p_last)
    assert_close_logprobs(got, expected_rows(logits, *params, min_p_last))


def test_a_weight_that_underflows_keeps_its_finite_logprob():
    logits = torch.tensor([[0.0, -50.0, -200.0, -1000.0]])
    one = (torch.ones(1), torch.zeros(1, dtype=torch.int64), torch.ones(1), torch.zeros(1))
    got = logprob_rows(logits, *one)
    assert_close_logprobs(got, torch.log_softmax(logits.double(), dim=-1))


def test_rows_without_mass_and_parameters_out_of_range_are_minus_inf():
    logits = torch.randn(3, 10)
    logits[0] = -torch.inf
    params = (torch.tensor([1.0, -1.0, 1.0]), torch.tensor([0, 0, -1]), torch.ones(3),
              torch.zeros(3))
    assert torch.isneginf(logprob_rows(logits, *params)).all()


@pytest.mark.parametrize("order", ["vllm", "transformers"])
def test_the_op_gives_each_tokens_logprob_and_the_top_tokens(order):
    logits, (t, k, p, m) = rows_inputs(seed=1)
    logits = logits.view(6, 2, V)
    params = tuple(value[::2] for value in (t, k, p, m))  # a request's two rows share them
    ids = torch.randint(0, V, (6, 2), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = logits[:, 0].argmax(dim=-1)  # kept in every row
    ids[5, 1] = -1  # no token: -inf, and no top tokens
    lp, top_ids, top_lp, _ = token_logprobs_op(logits, ids, *params, 6, order)
    rows = expected_rows(logits.view(12, V), *(rule.per_row(v, 6, 2) for v in params),
                         min_p_last=order == "transformers").view(6, 2, V)
    inside = (ids >= 0)
    want = torch.where(inside, rows.gather(2, ids.clamp(min=0)[..., None])[..., 0], -torch.inf)
    assert_close_logprobs(lp, want)
    assert torch.isfinite(lp[:, 0]).all()
    values, indices = rows.topk(6, dim=-1)
    values = torch.where(inside[..., None], values, -torch.inf)
    assert_close_logprobs(top_lp, values)
    assert torch.equal(top_ids, torch.where(values > -torch.inf, indices, -1).int())
    # Fewer kept tokens than asked for: -1 after them (the greedy row keeps one, top-k 5 five).
    assert (top_ids[0, :, 1:] == -1).all() and (top_ids[1, :, 5:] == -1).all()
    # The CPU backend's kept tokens are the reference's: the same values, bit for bit.
    reference = token_logprobs_reference(logits, ids, *params, 6, order)
    assert all(map(torch.equal, (lp, top_ids, top_lp), reference[:3]))
    # Several tokens a row: each the logprob it has alone.
    several = torch.stack([ids, logits.argmax(dim=-1), torch.full_like(ids, V)], dim=-1)
    lp3, top3 = token_logprobs_op(logits, several, *params, 6, order)[:2]
    assert torch.equal(lp3[..., 0], lp)
    assert torch.equal(lp3[..., 2], torch.full_like(lp, -torch.inf))
    assert torch.equal(top3[:5], top_ids[:5])


@pytest.mark.parametrize("backend", ["reference", "cpu",
                                     pytest.param("triton", marks=pytest.mark.interpreter)])
def test_top_tokens_of_equal_logprobs_are_the_largest_logits(backend):
    """At T = +inf (or one so large that every weight rounds to 1) every kept token has the same
    logprob: the most likely tokens are still the largest logits (docs/semantics.md), on every
    backend, not any k of the tied ones."""
    functions = dict(reference=token_logprobs_reference, cpu=token_logprobs_op,
                     triton=token_logprobs_triton)
    logits = torch.tensor([[[1.0, 5.0, 3.0, 4.0, 2.0]]]).expand(2, 1, 5).contiguous()
    params = (torch.tensor([torch.inf, 1e30]), torch.zeros(2, dtype=torch.int64), torch.ones(2),
              torch.zeros(2))
    _, top_ids, top_lp, _ = functions[backend](logits, torch.ones(2, 1, dtype=torch.int64),
                                               *params, 2)
    assert torch.equal(top_ids, torch.tensor([[[1, 3]], [[1, 3]]], dtype=torch.int32))
    assert torch.equal(top_lp, torch.full((2, 1, 2), -torch.log(torch.tensor(5.0)).item()))


@pytest.mark.interpreter
@pytest.mark.parametrize("order", ["vllm", "transformers"])
def test_triton_path_matches_the_reference(order):
    logits, params = rows_inputs(seed=2, rows=6, vocab=300)
    logits = logits.view(6, 1, 300)
    logits[0, 0, 7] = torch.nan  # counts as -inf
    logits[1, 0, :] = -torch.inf  # no mass
    ids = logits[:, :, :].nan_to_num(-torch.inf).argmax(dim=-1)
    ids[3] = 11
    got = token_logprobs_triton(logits, ids, *params, 5, order)
    want = token_logprobs_reference(logits, ids, *params, 5, order)
    assert_close_logprobs(got[0], want[0].double())
    assert torch.equal(got[1], want[1])
    assert_close_logprobs(got[2], want[2].double())


def entropy_by_hand(logits, params, min_p_last=False):
    p = rule.processed_rows(logits, *params, min_p_last=min_p_last).double()
    return -torch.where(p > 0, p * p.log(), 0.0).sum(-1)


@pytest.mark.parametrize("order", ["vllm", "transformers"])
def test_the_entropy_op_gives_each_processed_rows_entropy(order):
    logits, params = rows_inputs(seed=7)
    logits[3] = -torch.inf  # no mass: 0, as a greedy row's
    ids = torch.zeros(12, 1, dtype=torch.int64)
    got = token_logprobs_op(logits[:, None], ids, *params, 0, order, True)[3][:, 0]
    want = entropy_by_hand(logits, params, order == "transformers")
    assert (got.double() - want).abs().max() < 1e-5 and got[0] == 0 and got[3] == 0
    reference = token_logprobs_reference(logits[:, None], ids, *params, 0, order, True)[3][:, 0]
    assert (got - reference).abs().max() < 1e-6
    assert token_logprobs_op(logits[:, None], ids, *params)[3].shape == (12, 0)  # not asked


@pytest.mark.interpreter
def test_triton_entropy_matches_the_reference():
    logits, params = rows_inputs(seed=8, rows=6, vocab=300)
    logits[1, 7] = torch.nan
    ids = torch.zeros(6, 1, dtype=torch.int64)
    got = token_logprobs_triton(logits[:, None], ids, *params, 0, "vllm", True)[3][:, 0]
    assert (got.double() - entropy_by_hand(logits, params)).abs().max() < 1e-5


# ---------------------------------------------------------------------------------------------
# From the public functions

def step_inputs(seed=3):
    """Target logits, drafts mostly the target's argmax (accepted, so that later positions have
    tokens), a bias, a mask, counts and a prompt."""
    g = torch.Generator().manual_seed(seed)
    target = 2 * torch.randn(B, N + 1, V, generator=g)
    ids = target[:, :N].argmax(dim=-1)
    bias = 0.3 * torch.randn(B, V, generator=g)
    allowed = torch.rand(B, N + 1, V, generator=g) < 0.6
    allowed.scatter_(2, torch.cat([ids, ids[:, :1]], 1)[..., None], True)  # drafts allowed
    counts = torch.randint(0, 2, (B, V), generator=g) * (torch.rand(B, V, generator=g) < 0.2)
    prompt = torch.rand(B, V, generator=g) < 0.1
    return target, ids, bias, allowed, counts, prompt


STEP = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)


def adjusted_by_hand(target, ids, bias, allowed, counts, prompt):
    """Rule step 0 written out position by position: mask, bias, then vLLM's penalties with the
    drafts before each row counted as generated."""
    rows = []
    for j in range(target.shape[1]):
        generated = counts.clone()
        for i in range(j):
            generated[torch.arange(B), ids[:, i]] += 1
        x = torch.where(allowed[:, j], target[:, j] + bias, -torch.inf)
        seen = (generated > 0) | prompt
        x = torch.where(seen, torch.where(x > 0, x / 1.3, x * 1.3), x)
        rows.append(x - 0.4 * generated - 0.2 * (generated > 0).float())
    return torch.stack(rows, dim=1)


def at_outputs(rows, out):
    """rows (B, P, V) read at each output token; -inf where there is none."""
    return torch.where(out >= 0, rows.gather(2, out.clamp(min=0).long()[..., None])[..., 0],
                       -torch.inf)


def _chain_call(target, ids, bias, allowed, counts, prompt, **kwargs):
    return specops.chain_speculative_sampling_from_logits(
        None, ids, target, seed=torch.arange(B), logit_bias=bias,
        allowed_token_bitmask=rule.packed_bitmask(allowed), output_token_counts=counts,
        prompt_token_mask=prompt, **PARAMETERS, **STEP, **kwargs)


def test_processed_logprobs_are_the_rows_the_tokens_were_drawn_from():
    target, ids, bias, allowed, counts, prompt = step_inputs()
    out, _, _, lp, top_ids, top_lp = _chain_call(target, ids, bias, allowed, counts, prompt,
                                                 logprobs="processed", num_top_logprobs=3)
    assert (out[:, 2:] >= 0).any()  # later positions are read: the drafts before them count
    rows = expected_rows(adjusted_by_hand(target, ids, bias, allowed, counts, prompt)
                         .view(-1, V), *(rule.per_row(v, B, N + 1) for v in PARAMETERS.values())
                         ).view(B, N + 1, V)
    assert_close_logprobs(lp, at_outputs(rows, out))
    values = torch.where((out >= 0)[..., None], rows.topk(3, dim=-1).values, -torch.inf)
    assert_close_logprobs(top_lp, values)
    assert torch.equal(lp.isinf(), out < 0)  # every emitted token had probability


def test_raw_logprobs_are_the_log_softmax_of_the_logits_as_given():
    target, ids, bias, allowed, counts, prompt = step_inputs()
    out, _, _, lp, top_ids, top_lp = _chain_call(target, ids, bias, allowed, counts, prompt,
                                                 logprobs="raw", num_top_logprobs=2)
    raw = torch.log_softmax(target.double(), dim=-1)
    assert_close_logprobs(lp, at_outputs(raw, out))
    values, indices = raw.topk(2, dim=-1)
    assert torch.equal(top_ids, torch.where((out >= 0)[..., None], indices, -1).int())
    assert_close_logprobs(top_lp, torch.where((out >= 0)[..., None], values, -torch.inf))
    plain = specops.chain_speculative_sampling_from_logits(None, ids, target, seed=torch.arange(B),
                                                           **PARAMETERS)
    assert len(plain) == 3  # nothing asked for, nothing added


def test_a_flattened_batch_gets_the_padded_batchs_logprobs():
    target, ids, bias, allowed, counts, prompt = step_inputs()
    n = torch.tensor([3, 1, 0, 2])
    padded_ids = torch.where(torch.arange(N) < n[:, None], ids, -1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)])
    flat_ids = torch.cat([ids[b, :n[b]] for b in range(B)])
    flat_target = torch.cat([target[b, :n[b] + 1] for b in range(B)])
    flat_mask = rule.packed_bitmask(torch.cat([allowed[b, :n[b] + 1] for b in range(B)]))
    common = dict(seed=torch.arange(B), logit_bias=bias, output_token_counts=counts,
                  prompt_token_mask=prompt, **PARAMETERS, **STEP, logprobs="processed",
                  num_top_logprobs=4)
    padded = specops.chain_speculative_sampling_from_logits(
        None, padded_ids, target, allowed_token_bitmask=rule.packed_bitmask(allowed), **common)
    flat = specops.varlen.chain_speculative_sampling_from_logits(
        None, flat_ids, flat_target, cu, N, allowed_token_bitmask=flat_mask, **common)
    assert all(map(torch.equal, flat, padded))
    assert torch.isfinite(flat[3][:, 0]).all()


def test_a_trees_positions_read_their_nodes_rows():
    g = torch.Generator().manual_seed(4)
    nodes = 5
    target = 2 * torch.randn(B, nodes + 1, V, generator=g)
    parents = torch.tensor([0, 0, 1, 1, 2]).expand(B, nodes)
    ids = target.gather(1, parents[..., None].expand(B, nodes, V)).argmax(-1)  # parents' argmax
    bias = 0.3 * torch.randn(B, V, generator=g)
    out, node_ids, _, lp, top_ids, top_lp = specops.tree_speculative_sampling_from_logits(
        None, ids, parents, target, logit_bias=bias, seed=torch.arange(B), logprobs="processed",
        num_top_logprobs=2, **PARAMETERS)
    assert (out[:, 2:] >= 0).any()
    rows = expected_rows((target + bias[:, None]).view(-1, V),
                         *(rule.per_row(v, B, nodes + 1) for v in PARAMETERS.values())
                         ).view(B, nodes + 1, V)
    source = torch.cat([torch.zeros(B, 1, dtype=torch.int64), node_ids.long().clamp(min=0)], 1)
    path_rows = rows[torch.arange(B)[:, None], source]  # (B, M + 1, V): position j's row
    assert_close_logprobs(lp, at_outputs(path_rows, out))
    values = torch.where((out >= 0)[..., None], path_rows.topk(2, dim=-1).values, -torch.inf)
    assert_close_logprobs(top_lp, values)


def test_a_trees_rows_count_their_paths():
    """Position j's logprob under its node's row with every node's path counted as generated
    (penalties), as the rows adjusted one node at a time give it."""
    from specops.core.logits.rule import Step
    from specops.core.logprobs.outputs import run
    from specops.tree.logprobs import tree_logprobs
    from specops.tree.processed import tree_generated

    target, ids, bias, allowed, counts, prompt = step_inputs(seed=8)
    parents = torch.tensor([0, 1, 1]).expand(B, N)  # 1-2 a path, 3 under 1
    ids[:, 1] = ids[:, 0]  # node 2 repeats its parent's token
    step = Step(bias, rule.packed_bitmask(allowed), torch.tensor([1.3]), torch.tensor([2.0]),
                torch.tensor([0.5]), counts, prompt)
    g = torch.Generator().manual_seed(8)
    node_ids = torch.tensor([[1, 2, -1], [1, 3, -1], [2, -1, -1], [-1, -1, -1]]).int()
    output = torch.where(node_ids >= 0, ids.gather(1, (node_ids.long() - 1).clamp(min=0)), -1)
    output = torch.cat([output, torch.full((B, 1), -1)], 1)
    output.scatter_(1, (node_ids >= 0).sum(1, keepdim=True).long(),
                    torch.randint(0, V, (B, 1), generator=g))  # the last token
    parameters = [torch.tensor([1.0, 0.8, 1.0, 1.5]), torch.zeros(1, dtype=torch.int64),
                  torch.ones(1), torch.zeros(1)]  # nothing truncated: most tokens have mass
    got = tree_logprobs("processed", 2, target, ids, parents, output.int(), node_ids, parameters,
                        step, "vllm")
    rows = step.adjusted(target, lambda c: tree_generated(c, ids, parents))
    source = torch.cat([torch.zeros(B, 1, dtype=torch.int64), node_ids.long().clamp(min=0)], 1)
    path_rows = rows[torch.arange(B)[:, None], source]
    want = run("processed", 2, path_rows, output, parameters, "vllm")
    has = (output >= 0)[..., None]
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], torch.where(has, want[1], -1))
    assert torch.isfinite(got[0]).sum() >= 4 and not torch.equal(
        got[0], run("processed", 0, target[torch.arange(B)[:, None], source], output,
                    parameters, "vllm")[0])


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(logprobs="processd"), 'logprobs must be "processed", "raw" or None'),
    (dict(logprobs="raw", num_top_logprobs=V + 1), "num_top_logprobs must be an int in"),
    (dict(logprobs="raw", num_top_logprobs=True), "num_top_logprobs must be an int in"),
    (dict(num_top_logprobs=2), "num_top_logprobs needs logprobs"),
])
def test_the_arguments_are_checked_by_name(kwargs, fragment):
    target, ids, *_ = step_inputs()
    calls = (lambda: specops.chain_speculative_sampling_from_logits(None, ids, target, seed=1,
                                                                    **kwargs),
             lambda: specops.tree_speculative_sampling_from_logits(
                 None, ids, torch.zeros_like(ids), target, seed=1, **kwargs),
             lambda: specops.varlen.chain_speculative_sampling_from_logits(
                 None, ids.reshape(-1), target.reshape(-1, V)[:B * N + B],
                 torch.arange(B + 1) * N, N, seed=1, **kwargs))
    for call in calls:
        with pytest.raises(ValueError, match=fragment):
            call()


def test_opcheck():
    logits, (t, k, p, m) = rows_inputs(seed=5)
    ids = torch.randint(-1, V, (6, 2), generator=torch.Generator().manual_seed(5))
    for num_top in (0, 3):
        torch.library.opcheck(token_logprobs_op, (logits.view(6, 2, V), ids, t[::2], k[::2],
                                                  p[::2], m[::2], num_top, "transformers"))
    torch.library.opcheck(token_logprobs_op, (logits.view(6, 2, V), ids, t[::2], k[::2],
                                              p[::2], m[::2], 0, "vllm", True))
    # Rule step 0: padded rows with each row's list, and a flattened batch.
    target, ids, bias, allowed, counts, prompt = step_inputs()
    step = (bias, rule.packed_bitmask(allowed), torch.tensor([1.3]), None, torch.tensor([0.2]),
            counts, prompt)
    tokens = torch.cat([ids, ids[:, :1]], 1)
    lists = ids[:, None, :].expand(B, N + 1, N)
    torch.library.opcheck(token_logprobs_op, (target, tokens, *PARAMETERS.values(), 2, "vllm",
                                              True, lists, None, *step))
    cu = torch.tensor([0, 3, 4, 4, 6])
    flat_mask = rule.packed_bitmask(allowed.view(-1, V)[:10])
    torch.library.opcheck(token_logprobs_op, (target.view(-1, V)[:10], tokens, *PARAMETERS.values(),
                                              0, "vllm", False, ids.view(-1)[:6], cu, bias,
                                              flat_mask,
                                              *step[2:]))


@pytest.mark.parametrize("args, fragment", [
    (dict(generated_ids=torch.zeros(B, N, dtype=torch.int64)), r"generated_ids must have shape"),
    (dict(generated_ids=torch.zeros(B, N + 1, 2)), "generated_ids must have dtype"),
    (dict(cu_num_draft_tokens=torch.tensor([0, 1, 2, 3, 4])), "logits must have shape"),
    (dict(logit_bias=torch.zeros(B, V + 1)), "logit_bias must have shape"),
    (dict(repetition_penalty=torch.ones(1)), "output_token_counts must be given"),
])
def test_the_ops_step_inputs_are_checked_by_name(args, fragment):
    target, ids, *_ = step_inputs()
    tokens = torch.cat([ids, ids[:, :1]], 1)
    with pytest.raises((ValueError, TypeError), match=fragment):
        token_logprobs_op(target, tokens, *PARAMETERS.values(), **args)
    flat = dict(generated_ids=ids.view(-1)[:5], cu_num_draft_tokens=torch.tensor([0, 1, 2, 3, 5]))
    token_logprobs_op(target.view(-1, V)[:9], tokens[:, :3], *PARAMETERS.values(), **flat)
    with pytest.raises(ValueError, match="generated_ids must have shape"):
        token_logprobs_op(target.view(-1, V)[:10], tokens[:, :3], *PARAMETERS.values(), **flat)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_equals_eager(backend):
    target, ids, bias, allowed, counts, prompt = step_inputs()

    def call(target, ids, bias, counts):
        return specops.chain_speculative_sampling_from_logits(
            None, ids, target, seed=torch.arange(B), logit_bias=bias, output_token_counts=counts,
            logprobs="processed", num_top_logprobs=2, **PARAMETERS, **STEP)

    args = (target, ids, bias, counts)
    torch._dynamo.reset()
    compiled = torch.compile(call, backend=backend, fullgraph=True)
    got, want = compiled(*args), call(*args)
    assert len(got) == 6 and all(map(torch.equal, got, want))


@pytest.mark.parametrize("backend", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_empty_batches_and_chains_without_drafts(backend, monkeypatch):
    """No request, and requests without drafts: logprobs and lossy acceptance, with penalties
    and a grammar mask, give outputs of the padded shapes (nothing to reshape from: no size
    inferred)."""
    from specops.core.logits.rule import packed_bitmask
    if backend == "triton":
        monkeypatch.setenv("SPECOPS_BACKEND", "triton")
    vocab = 20
    for batch, n in ((0, 3), (2, 0)):
        logits = torch.randn(batch, n + 1, vocab)
        ids = torch.zeros(batch, n, dtype=torch.int64)
        step = dict(logit_bias=torch.zeros(batch, vocab), repetition_penalty=1.2,
                    output_token_counts=torch.zeros(batch, vocab, dtype=torch.int32))
        cu = torch.zeros(batch + 1, dtype=torch.int64)
        flat = logits[:, :1].reshape(batch, vocab)  # no drafts: one row a request
        masks = packed_bitmask(torch.ones(batch, n + 1, vocab, dtype=torch.bool))
        flat_masks = masks[:, 0]
        for extra in (dict(logprobs="processed", num_top_logprobs=2),
                      dict(acceptance="typical")):
            chain = specops.chain_speculative_sampling_from_logits(
                None, ids, logits, seed=0, allowed_token_bitmask=masks, **step, **extra)
            assert chain[0].shape == (batch, n + 1) and len(chain) == 3 + 3 * ("logprobs" in extra)
            varlen = specops.varlen.chain_speculative_sampling_from_logits(
                None, ids.new_zeros(0), flat, cu, n, seed=0, allowed_token_bitmask=flat_masks,
                **step, **extra)
            assert [tuple(t.shape) for t in varlen] == [tuple(t.shape) for t in chain]
            if n:
                tree = specops.tree_speculative_sampling_from_logits(
                    None, ids, torch.zeros_like(ids), logits, seed=0,
                    allowed_token_bitmask=masks, **step, **extra)
                assert tree[0].shape == (batch, n + 1)
