"""Opt-in lossy acceptance (docs/semantics.md, "Lossy acceptance"): Medusa's typical acceptance
keeps exactly the drafts its rule keeps, by hand, and emits the argmax after a rejection and a
draw from the last row otherwise (its distribution by chi-square); a synthetic acceptance rate
gives the truncated geometric lengths and draws the last token from its row; greedy requests
decode as under exact acceptance; a flattened batch gets the padded batch's tokens; the Triton
path (interpreter) gives the torch path's; the arguments are checked by name."""

from __future__ import annotations

import math

import pytest
import torch

import specops
import specops.varlen
from specops.core.logits import rule

import worlds  # tests/worlds.py

B, N, V = 6, 4, 50
P_THRESHOLD = 1e-4
PARAMETERS = dict(temperature=torch.tensor([0.8, 1.0, 0.0, 1.2, 0.6, 1.0]),
                  top_k=torch.tensor([0, 10, 0, 0, 5, 0]),
                  min_p=torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0, 0.0]))


def inputs(seed=0, batch=B, vocab=V, scale=3.0):
    """Logits, and drafts that are mostly the rows' argmax with some other tokens and a short
    draft, so that typical acceptance both keeps and rejects."""
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(batch, N + 1, vocab, generator=g)
    ids = logits[:, :N].argmax(dim=-1)
    other = torch.rand(batch, N, generator=g) < 0.3
    ids = torch.where(other, torch.randint(0, vocab, (batch, N), generator=g), ids)
    ids[-1, 2:] = -1
    return logits, ids


def processed(logits):
    """The processed rows (B, N + 1, V) float64 under PARAMETERS."""
    return rule.processed_requests(logits, PARAMETERS["temperature"], PARAMETERS["top_k"],
                                   torch.ones(1), PARAMETERS["min_p"]).double()


def typical_by_hand(logits, ids, threshold=0.09, alpha=0.3):
    """(kept (B, N), length (B,)): Medusa's rule, p(d) > min(threshold, alpha exp(-H(p)))."""
    p = processed(logits)[:, :N]
    entropy = -torch.where(p > 0, p * p.log(), 0.0).sum(-1)
    bar = torch.minimum(torch.full_like(entropy, threshold), alpha * torch.exp(-entropy))
    drafting = (ids >= 0).int().cumprod(-1).bool()
    kept = (p.gather(2, ids.clamp(min=0)[..., None])[..., 0] > bar) & drafting
    return kept, kept.int().cumprod(-1).sum(-1)


def call(logits, ids, seed, **kwargs):
    return specops.chain_speculative_sampling_from_logits(None, ids, logits, seed=seed,
                                                          **PARAMETERS, **kwargs)


# vLLM's defaults; a looser threshold; no threshold, where the entropy alone sets the bar.
@pytest.mark.parametrize("threshold, alpha, scale", [(None, None, 3.0), (0.3, 0.9, 3.0),
                                                     (1.0, 0.5, 1.0)])
def test_typical_acceptance_keeps_what_its_rule_keeps(threshold, alpha, scale):
    logits, ids = inputs(scale=scale)
    kept, length = typical_by_hand(logits, ids, threshold or 0.09, alpha or 0.3)
    assert ((length > 0) & (length < N)).any() and (length == N).any()  # both happen
    p = processed(logits)
    for seed in range(8):  # the kept drafts do not depend on the seed; the last token may
        out, accepted, emitted = call(logits, ids, torch.arange(B) + 10 * seed,
                                      acceptance="typical", posterior_threshold=threshold,
                                      posterior_alpha=alpha)
        assert torch.equal(emitted, length.int()) and torch.equal(accepted, kept.sum(-1).int())
        for b in range(B):
            n = int(length[b])
            assert out[b, :n].tolist() == ids[b, :n].tolist() and (out[b, n + 1:] == -1).all()
            last = int(out[b, n])
            if n < int((ids[b] >= 0).sum()):  # a rejected draft: the argmax of its row
                assert last == int(p[b, n].argmax())
            else:  # every draft kept: a token the last row gives probability
                assert p[b, n, last] > 0


def test_typical_acceptance_draws_the_last_token_from_its_row():
    # One request whose drafts are always kept (its rows' argmax, a sharp row): the bonus token,
    # over seeds, follows the processed last row.
    logits, ids = inputs(seed=1, batch=1, vocab=6)
    logits[:, :N] *= 4  # sharp rows: their argmax drafts kept
    logits[:, N] /= 3  # a soft last row
    ids = logits[:, :N].argmax(dim=-1)
    params = dict(temperature=torch.tensor([1.0]))
    seeds = 4000
    tokens = specops.chain_speculative_sampling_from_logits(
        None, ids.expand(seeds, N), logits.expand(seeds, -1, -1), seed=torch.arange(seeds),
        acceptance="typical", **params)[0]
    assert (tokens[:, :N] == ids).all()
    expected = torch.softmax(logits[0, N].double(), -1)
    counts = torch.bincount(tokens[:, N].long(), minlength=6)
    assert worlds.chi2_pvalue(counts, expected) > P_THRESHOLD
    colder = torch.softmax(2 * logits[0, N].double(), -1)  # another temperature: told apart
    assert worlds.chi2_pvalue(counts, colder) < P_THRESHOLD


def test_synthetic_rate_gives_geometric_lengths_and_draws_from_the_row():
    logits, _ = inputs(seed=2, batch=1, vocab=6)
    seeds, rate = 6000, 0.6
    ids = torch.randint(0, 6, (seeds, N), generator=torch.Generator().manual_seed(2))
    out, accepted, emitted = specops.chain_speculative_sampling_from_logits(
        None, ids, logits.expand(seeds, -1, -1), seed=torch.arange(seeds), acceptance_rate=rate)
    expected = torch.tensor([rate**j * (1 - rate) for j in range(N)] + [rate**N],
                            dtype=torch.float64)
    assert worlds.chi2_pvalue(torch.bincount(emitted.long(), minlength=N + 1), expected) > \
        P_THRESHOLD
    assert abs(accepted.double().mean() / N - rate) < 0.02  # each coin on its own
    first = out[emitted == 0, 0].long()  # rejected at once: a draw from row 0
    assert worlds.chi2_pvalue(torch.bincount(first, minlength=6),
                              torch.softmax(logits[0, 0].double(), -1)) > P_THRESHOLD
    for r in (0.0, 1.0):
        _, _, e = specops.chain_speculative_sampling_from_logits(
            None, ids[:8], logits.expand(8, -1, -1), seed=1, acceptance_rate=r)
        assert (e == int(r) * N).all()


def test_greedy_requests_decode_as_under_exact_acceptance():
    logits, ids = inputs(seed=3)
    greedy = dict(PARAMETERS, temperature=torch.zeros(B))
    exact = specops.chain_speculative_sampling_from_logits(None, ids, logits, seed=1, **greedy)
    typical = specops.chain_speculative_sampling_from_logits(None, ids, logits, seed=1,
                                                             acceptance="typical", **greedy)
    assert all(map(torch.equal, exact, typical))


@pytest.mark.parametrize("kwargs", [dict(acceptance="typical"), dict(acceptance_rate=0.7)])
def test_a_flattened_batch_gets_the_padded_batchs_tokens(kwargs):
    logits, ids = inputs(seed=4)
    n = torch.tensor([4, 0, 2, 3, 1, 2])
    padded_ids = torch.where(torch.arange(N) < n[:, None], ids, -1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)])
    flat_ids = torch.cat([ids[b, :n[b]] for b in range(B)])
    flat = torch.cat([logits[b, :n[b] + 1] for b in range(B)])
    common = dict(seed=torch.arange(B), logit_bias=torch.randn(B, V), **PARAMETERS, **kwargs)
    want = specops.chain_speculative_sampling_from_logits(None, padded_ids, logits, **common)
    got = specops.varlen.chain_speculative_sampling_from_logits(None, flat_ids, flat, cu, N,
                                                                **common)
    assert all(map(torch.equal, got, want))


@pytest.mark.interpreter
@pytest.mark.parametrize("kwargs", [dict(acceptance="typical"), dict(acceptance_rate=0.5)])
def test_triton_path_gives_the_torch_paths_tokens(kwargs, monkeypatch):
    logits, ids = inputs(seed=5, batch=3, vocab=300)
    params = {name: value[:3] for name, value in PARAMETERS.items()}
    args = dict(seed=torch.arange(3), logprobs="processed", **params, **kwargs)
    want = specops.chain_speculative_sampling_from_logits(None, ids, logits, **args)
    monkeypatch.setenv("SPECOPS_BACKEND", "triton")
    got = specops.chain_speculative_sampling_from_logits(None, ids, logits, **args)
    assert all(map(torch.equal, got[:3], want[:3]))
    assert torch.allclose(got[3], want[3], atol=1e-5) and torch.equal(got[3].isinf(),
                                                                      want[3].isinf())


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(acceptance="lossy"), 'acceptance must be "exact" or "typical"'),
    (dict(posterior_threshold=0.1), 'posterior_threshold applies to acceptance="typical"'),
    (dict(acceptance="typical", posterior_alpha=-1.0), "posterior_alpha must be a finite"),
    (dict(acceptance="typical", posterior_alpha=10**400), "posterior_alpha must be a finite"),
    (dict(acceptance_rate=1.5), r"acceptance_rate must be a number in \[0, 1\]"),
    (dict(acceptance="typical", acceptance_rate=0.5), "acceptance_rate replaces"),
    (dict(acceptance="typical", verification="block"), "lossy acceptance replaces it"),
])
def test_the_arguments_are_checked_by_name(kwargs, fragment):
    logits, ids = inputs()
    flattened = (None, ids.clamp(min=0).reshape(-1), logits.reshape(-1, V),
                 torch.arange(B + 1) * N, N)
    for function, args in ((specops.chain_speculative_sampling_from_logits, (None, ids, logits)),
                           (specops.varlen.chain_speculative_sampling_from_logits, flattened)):
        with pytest.raises(ValueError, match=fragment):
            function(*args, seed=1, **kwargs)


@pytest.mark.parametrize("lossy", [dict(acceptance="typical"), dict(acceptance_rate=0.5)],
                         ids=["typical", "rate"])
def test_validation_mode_refuses_under_lossy_acceptance_what_it_refuses_under_exact(
        lossy, monkeypatch):
    """SPECOPS_VALIDATE=1 checks the values lossy acceptance is given as it checks exact
    acceptance's, on every single-device entry: an id past the vocabulary, a NaN logit, a parent
    that is not an earlier node (the ops lossy acceptance runs read only part of the input)."""
    logits, ids = inputs()
    bad_ids = ids.clone()
    bad_ids[0, 0] = V + 3
    nan = logits.clone()
    nan[1, 0, 0] = torch.nan
    parents = torch.arange(N).expand(B, -1).clone()
    flat = lambda ids, logits: specops.varlen.chain_speculative_sampling_from_logits(  # noqa: E731
        None, ids.reshape(-1), logits.reshape(-1, V), torch.arange(B + 1) * N, N, seed=1,
        **lossy)
    chain = lambda ids, logits: specops.chain_speculative_sampling_from_logits(  # noqa: E731
        None, ids, logits, seed=1, **lossy)
    tree = lambda ids, logits, parents=parents: \
        specops.tree_speculative_sampling_from_logits(None, ids, parents, logits, seed=1, **lossy)
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    for entry in (chain, flat, tree):
        entry(ids, logits)  # good values pass
        with pytest.raises(ValueError, match="draft_token_ids must be -1"):
            entry(bad_ids, logits)
        with pytest.raises(ValueError, match="target_logits must be a number or -inf"):
            entry(ids, nan)
    parents[0, 1] = 3
    with pytest.raises(ValueError, match="parents must give node i \\+ 1 a parent in"):
        tree(ids, logits, parents)


def test_a_python_int_threshold_is_the_number_it_stands_for():
    """posterior_threshold and posterior_alpha as Python ints, past int64's range too: the
    numbers they are, as floats give them, not an overflow inside torch."""
    logits, ids = inputs()
    call = lambda **kw: specops.chain_speculative_sampling_from_logits(  # noqa: E731
        None, ids, logits, seed=1, acceptance="typical", **kw)
    for given, same in ((dict(posterior_threshold=2**70), dict(posterior_threshold=2.0**70)),
                        (dict(posterior_alpha=2**70), dict(posterior_alpha=2.0**70)),
                        (dict(posterior_threshold=0), dict(posterior_threshold=0.0))):
        assert all(map(torch.equal, call(**given), call(**same))), given


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_equals_eager(backend):
    logits, ids = inputs(seed=6)

    def run(logits, ids):
        typical = call(logits, ids, torch.arange(B), acceptance="typical")
        rate = call(logits, ids, torch.arange(B), acceptance_rate=0.5)
        return typical + rate

    torch._dynamo.reset()
    compiled = torch.compile(run, backend=backend, fullgraph=True)
    assert all(map(torch.equal, compiled(logits, ids), run(logits, ids)))


def test_typical_acceptance_is_lossy():
    # What its docs say: the output does not follow the target. A draft the target gives 20% is
    # kept every time (0.2 > min(0.09, ...)) where exact acceptance keeps it 20% of the time.
    logits = torch.log(torch.tensor([[[0.2, 0.8], [0.5, 0.5]]]))
    ids = torch.tensor([[0]])
    seeds = torch.arange(400)
    typical = specops.chain_speculative_sampling_from_logits(
        None, ids.expand(400, 1), logits.expand(400, -1, -1), seed=seeds, acceptance="typical")
    exact = specops.chain_speculative_sampling_from_logits(
        None, ids.expand(400, 1), logits.expand(400, -1, -1), seed=seeds)
    assert (typical[2] == 1).all()
    assert 0.14 < exact[2].double().mean() < 0.26  # the target's 20%


# ---------------------------------------------------------------------------------------------
# Trees

def tree_inputs(seed=7, batch=B, vocab=V):
    """Logits per node, a tree of width 2 and depth 3 (parents before children), each node's
    token its parent row's argmax or, for about a third, another token."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.tensor([0, 0, 1, 1, 2, 3, 3])
    nodes = parents.shape[0]
    logits = 3 * torch.randn(batch, nodes + 1, vocab, generator=g)
    ids = logits[:, parents].argmax(dim=-1)
    other = torch.rand(batch, nodes, generator=g) < 0.35
    ids = torch.where(other, torch.randint(0, vocab, (batch, nodes), generator=g), ids)
    return logits, ids, parents.expand(batch, nodes).contiguous()


def tree_typical_by_hand(logits, ids, parents, threshold=0.09, alpha=0.3):
    """(the deepest kept node (B,), its depth (B,)), node by node in plain Python."""
    p = processed(logits)
    entropy = -torch.where(p > 0, p * p.log(), 0.0).sum(-1)
    best, length = [], []
    for b in range(ids.shape[0]):
        kept, depth = {0: True}, {0: 0}
        for i in range(ids.shape[1]):
            row = int(parents[b, i])
            bar = min(threshold, alpha * math.exp(-float(entropy[b, row])))
            kept[i + 1] = kept[row] and float(p[b, row, ids[b, i]]) > bar
            depth[i + 1] = depth[row] + 1
        deepest = max(range(ids.shape[1] + 1), key=lambda n: (kept[n] and depth[n], -n))
        best.append(deepest)
        length.append(depth[deepest])
    return best, length


def test_tree_typical_acceptance_keeps_the_deepest_kept_path():
    logits, ids, parents = tree_inputs()
    out, node_ids, emitted = specops.tree_speculative_sampling_from_logits(
        None, ids, parents, logits, seed=torch.arange(B), acceptance="typical", **PARAMETERS)
    best, length = tree_typical_by_hand(logits, ids, parents)
    assert emitted.tolist() == length and len(set(length)) > 1
    p = processed(logits)
    for b in range(B):
        path, node = [], best[b]
        while node > 0:
            path.insert(0, node)
            node = int(parents[b, node - 1])
        n = length[b]
        assert node_ids[b, :n].tolist() == path and (node_ids[b, n:] == -1).all()
        assert out[b, :n].tolist() == [int(ids[b, k - 1]) for k in path]
        last = int(out[b, n])
        if (parents[b] == best[b]).any():  # children, all rejected: the argmax of its row
            assert last == int(p[b, best[b]].argmax())
        else:
            assert p[b, best[b], last] > 0
        assert (out[b, n + 1:] == -1).all()


def test_a_chain_shaped_tree_keeps_what_the_chain_keeps():
    logits, ids = inputs(seed=8)
    parents = torch.arange(N).expand(B, N)
    chain = call(logits, ids, torch.arange(B), acceptance="typical")
    tree = specops.tree_speculative_sampling_from_logits(
        None, ids, parents, logits, seed=torch.arange(B), acceptance="typical", **PARAMETERS)
    assert torch.equal(tree[2], chain[2])
    rejected = chain[2] < (ids >= 0).sum(-1)  # the last token is the argmax: the same
    assert rejected.any() and torch.equal(tree[0][rejected], chain[0][rejected])


def test_a_tree_at_rates_zero_and_one():
    logits, ids, parents = tree_inputs(seed=9)
    for rate, depth in ((0.0, 0), (1.0, 3)):
        out, node_ids, emitted = specops.tree_speculative_sampling_from_logits(
            None, ids, parents, logits, seed=1, acceptance_rate=rate)
        assert (emitted == depth).all()
    assert (node_ids[:, :3] == torch.tensor([1, 3, 6])).all()  # the first path of depth 3


def test_tree_arguments_are_checked_by_name():
    logits, ids, parents = tree_inputs()
    for kwargs, fragment in ((dict(acceptance="lossy"), 'acceptance must be "exact" or'),
                             (dict(acceptance_rate=-0.1), "acceptance_rate must be a number")):
        with pytest.raises(ValueError, match=fragment):
            specops.tree_speculative_sampling_from_logits(None, ids, parents, logits, seed=1,
                                                          **kwargs)


@pytest.mark.interpreter
def test_tree_triton_path_gives_the_torch_paths_tokens(monkeypatch):
    logits, ids, parents = tree_inputs(seed=10, batch=2, vocab=300)
    args = dict(seed=torch.arange(2), acceptance="typical", posterior_alpha=0.9,
                temperature=torch.tensor([0.8, 1.0]))
    want = specops.tree_speculative_sampling_from_logits(None, ids, parents, logits, **args)
    monkeypatch.setenv("SPECOPS_BACKEND", "triton")
    got = specops.tree_speculative_sampling_from_logits(None, ids, parents, logits, **args)
    assert all(map(torch.equal, got, want))


# ---------------------------------------------------------------------------------------------
# Rule step 0, applied as the rows are read

def step_for(logits, ids, seed):
    """Every part of rule step 0 for requests' rows (B, rows, V), strong enough to move the
    rows: a bias, a mask that allows the drafts, penalties and a prompt mask."""
    g = torch.Generator().manual_seed(seed)
    batch, rows, vocab = logits.shape
    allowed = torch.rand(batch, rows, vocab, generator=g) < 0.7
    allowed.scatter_(2, ids.clamp(0, vocab - 1)[:, None, :].expand(batch, rows, -1), True)
    return dict(logit_bias=torch.randn(batch, vocab, generator=g),
                allowed_token_bitmask=rule.packed_bitmask(allowed), repetition_penalty=1.5,
                frequency_penalty=torch.full((batch,), 8.0), presence_penalty=0.3,
                output_token_counts=torch.randint(0, 2, (batch, vocab), generator=g).int(),
                prompt_token_mask=torch.rand(batch, vocab, generator=g) < 0.1)


def adjusted(logits, kwargs, generated):
    step = rule.Step(kwargs["logit_bias"], kwargs["allowed_token_bitmask"],
                     *(torch.tensor([v]) if isinstance(v, float) else v for v in (
                         kwargs["repetition_penalty"], kwargs["frequency_penalty"],
                         kwargs["presence_penalty"])),
                     kwargs["output_token_counts"], kwargs["prompt_token_mask"])
    return step.adjusted(logits, generated)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("layout", ["chain", "flattened", "tree"])
def test_step_0_is_applied_as_the_rows_are_read(layout, backend, monkeypatch):
    """Seed for seed, lossy acceptance with rule step 0 (each row counting the drafts or the
    path before it) gives the tokens it gives the adjusted rows written out; on a GPU (Triton)
    no adjusted row is written, only the last token's row a request."""
    from specops.tree.processed import tree_generated

    batch, vocab = 3, 300
    args = dict(seed=torch.arange(batch), acceptance="typical", posterior_alpha=0.9,
                temperature=torch.tensor([0.8, 1.0, 0.0]))
    # A draft repeats the one before it on its path, its row's favourite unless the penalties
    # count that one: kept if they do not, and then the row's argmax another token.
    if layout == "tree":
        logits, ids, parents = tree_inputs(seed=11, batch=batch, vocab=vocab)
        ids[:, 2] = ids[:, 0]  # node 2, under node 0
        logits[torch.arange(batch), 1, ids[:, 0]] += 10.0
        kwargs = step_for(logits, ids, seed=11)
        rows = adjusted(logits, kwargs, lambda c: tree_generated(c, ids, parents))

        def call(logits, **step):
            return specops.tree_speculative_sampling_from_logits(None, ids, parents, logits,
                                                                 **args, **step)
    else:
        logits, ids = inputs(seed=12, batch=batch, vocab=vocab)
        ids[:, 1] = ids[:, 0]
        logits[torch.arange(batch), 1, ids[:, 0]] += 10.0
        kwargs = step_for(logits, ids, seed=12)
        rows = adjusted(logits, kwargs, lambda c: rule.chain_generated(c, ids))

        def call(logits, **step):
            if layout == "chain":
                return specops.chain_speculative_sampling_from_logits(None, ids, logits, **args,
                                                                      **step)
            return specops.varlen.chain_speculative_sampling_from_logits(
                None, flat_ids, logits, cu, N, **args, **step)
    if layout != "flattened":
        want = call(rows)
    else:  # the drafts before each request's first -1, flattened
        n = (ids >= 0).sum(-1)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)])
        flat_ids = torch.cat([ids[b, :n[b]] for b in range(batch)])

        def flattened(rows):
            return torch.cat([rows[b, :n[b] + 1] for b in range(batch)])

        want = specops.chain_speculative_sampling_from_logits(None, ids, rows, **args)
        logits = flattened(logits)
        kwargs["allowed_token_bitmask"] = flattened(kwargs["allowed_token_bitmask"])
    plain = call(logits)
    if backend == "triton":
        monkeypatch.setenv("SPECOPS_BACKEND", "triton")
        monkeypatch.setattr(rule, "adjusted_logits", lambda *a: pytest.fail("rows adjusted"))
    from inputs import Allocations  # tests/inputs.py

    with Allocations() as allocations:
        got = call(logits, **kwargs)
    assert all(map(torch.equal, got, want))
    assert any(not torch.equal(a, b) for a, b in zip(got, plain))  # step 0 moved the tokens
    if backend == "triton":  # (B, 1 or 2, V): the last token's row, as the exact op reads it;
        # (B, V): its counts, the drafts before it counted
        rows_made = [shape for shape, _ in allocations.made if shape[-1:] == (vocab,)]
        assert all(shape[:-1] in ((batch,), (batch, 1), (batch, 2)) for shape in rows_made), \
            rows_made
