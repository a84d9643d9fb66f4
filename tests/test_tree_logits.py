"""Tree verification from logits (specops.tree_speculative_sampling_from_logits): the rule of
verification from logits (core/logits/rule.py) on every row, then the tree rules. The op's
registration, its CPU backend and Triton path against the reference token for token, greedy
trees keep the target's argmax path, and whole decoded sequences follow the processed target."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import specops
from specops.core.logits import rule
from specops.core.sampling.race_triton import masses_residual
from specops.core.sampling.values_triton import ONE_HOT, STATS
from specops.tree.cpu import tree_speculative_sampling_from_logits_cpu
from specops.tree.reference import tree_speculative_sampling_from_logits_reference

import test_tree_statistics as tree_stats  # tests/test_tree_statistics.py: its decoding
import worlds  # tests/worlds.py
from inputs import DEVICE, full_tree, seeds, tree_inputs  # tests/inputs.py

OP = torch.ops.specops.tree_speculative_sampling_from_logits


def parameters(batch):
    """Per-request parameters: greedy, plain, and each truncation (top-k, top-p, min-p, all)."""
    pick = lambda *values: torch.tensor(values[:batch])
    return (pick(0.0, 1.0, 0.7, 1.3, 1.0, 0.8), torch.tensor([0, 0, 3, 0, 0, 20][:batch]),
            pick(1.0, 1.0, 1.0, 0.8, 1.0, 0.9), pick(0.0, 0.0, 0.0, 0.0, 0.1, 0.01))


def logits_inputs(batch, num_nodes, vocab, draft, seed, device="cpu"):
    q, ids, parents, p = tree_inputs(batch, num_nodes, vocab, parents=full_tree(2, 2),
                                     sharp=2.0, seed=seed, device=device)
    target = (p.log() * 2).round(decimals=1)  # ties among the logits
    draft_logits = (q.log() * 2).round(decimals=1)
    return {"probs": (q, None), "logits": (None, draft_logits), None: (None, None)}[draft], \
        ids, parents, target


@pytest.mark.parametrize("draft", ["probs", "logits", None])
def test_opcheck(draft):
    (q, draft_logits), ids, parents, target = logits_inputs(6, 6, 40, draft, seed=1)
    seed, offset = torch.tensor([3]), torch.tensor([0])
    torch.library.opcheck(OP, (q, ids, parents, target, draft_logits, seed, offset,
                               *parameters(6), True))
    if draft == "logits":  # with the draft's own parameters
        torch.library.opcheck(OP, (q, ids, parents, target, draft_logits, seed, offset,
                                   *parameters(6), True, torch.tensor([0.5]), None,
                                   torch.tensor([0.8]), None))


@pytest.mark.parametrize("draft", ["probs", "logits", None])
@pytest.mark.parametrize("replacement", [True, False])
def test_cpu_backend_gives_the_references_tokens(draft, replacement):
    for trial in range(4):
        (q, draft_logits), ids, parents, target = logits_inputs(6, 6, 300, draft, seed=trial)
        seed, offset = torch.arange(6) * 11 + trial, torch.tensor([trial])
        args = (q, ids, parents, target, draft_logits, seed, offset, *parameters(6), replacement)
        expected = tree_speculative_sampling_from_logits_reference(*args)
        got = tree_speculative_sampling_from_logits_cpu(*args)
        for a, b in zip(got, expected):
            assert torch.equal(a, b), trial


def test_public_function_is_the_op_and_names_its_arguments():
    (q, _), ids, parents, target = logits_inputs(6, 6, 40, "probs", seed=2)
    t, k, p, m = parameters(6)
    out = specops.tree_speculative_sampling_from_logits(q, ids, parents, target, temperature=t,
                                                         top_k=k, top_p=p, min_p=m, seed=5)
    expected = OP(q, ids, parents, target, None, torch.tensor([5]), torch.tensor([0]), t, k, p, m)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    with pytest.raises(ValueError, match="target_logits must have shape"):
        specops.tree_speculative_sampling_from_logits(q, ids, parents, target[0], seed=5)
    with pytest.raises(ValueError, match="not both"):
        specops.tree_speculative_sampling_from_logits(q, ids, parents, target, draft_logits=target,
                                                      seed=5)
    with pytest.raises(ValueError, match="top_p"):
        specops.tree_speculative_sampling_from_logits(q, ids, parents, target, top_p=1.5, seed=5)


@pytest.mark.parametrize("draft", ["probs", None])
def test_greedy_trees_keep_the_targets_argmax_path(draft):
    """Temperature 0: from the root, the child carrying the argmax of its node's target row is
    kept, as far as the tree holds it; then the argmax of the last node's row."""
    (q, _), ids, parents, target = logits_inputs(8, 6, 6, draft, seed=3)
    ids[:4, 0] = target[:4, 0].argmax(-1)  # half the trees hold the first argmax
    out, nodes, emitted = specops.tree_speculative_sampling_from_logits(
        q, ids, parents, target, temperature=0.0, seed=9)
    for b in range(8):
        node, path = 0, []
        while True:
            best = int(target[b, node].argmax())
            child = [i + 1 for i in range(6) if int(parents[b, i]) == node and int(ids[b, i]) == best]
            if not child:
                break
            node = child[0]
            path.append(best)
        assert out[b, : len(path) + 1].tolist() == path + [int(target[b, node].argmax())]
        assert int(emitted[b]) == len(path)
    assert (emitted[:4] >= 1).all()


@pytest.mark.parametrize("mode,params", [("iid", dict(temperature=0.7, top_p=0.9)),
                                         ("top-k", dict(temperature=1.3, top_k=3))])
def test_sequences_follow_the_processed_target(mode, params):
    """Whole sequences decoded by repeated calls follow the product of the processed target rows
    (the world's rows as logits, under the parameters); against the unprocessed rows they do not
    (the test detects a call that ignores the parameters)."""
    vocab, width, depth, seed, scale = 4, 2, 3, 3, 2.0
    p, q = tree_stats.make_world(vocab, depth, seed, scale)
    n = p.shape[0]
    processed = rule.processed_rows(p.float().log(), torch.full((n,), params["temperature"]),
                                    torch.full((n,), params.get("top_k", 0)),
                                    torch.full((n,), params.get("top_p", 1.0)),
                                    torch.zeros(n)).double()

    def run(draft_probs, ids, parents, target_probs, seed, offset):
        return specops.tree_speculative_sampling_from_logits(
            None if mode == "top-k" else draft_probs, ids, parents, target_probs.log(),
            seed=seed, offset=offset, **params)

    tokens = tree_stats.decode(run, p, q, width, depth, mode, seed)
    assert worlds.joint_pvalue(tokens, processed) > tree_stats.P_THRESHOLD
    assert worlds.joint_pvalue(tokens, p) < tree_stats.P_THRESHOLD


def test_compiled_call_equals_eager():
    (q, _), ids, parents, target = logits_inputs(6, 6, 40, "probs", seed=4)
    t, k, p, m = parameters(6)

    def call(q, ids, parents, target):
        return specops.tree_speculative_sampling_from_logits(
            q, ids, parents, target, temperature=t, top_k=k, top_p=p, min_p=m, seed=7)

    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(q, ids, parents, target), call(q, ids, parents, target)):
        assert torch.equal(a, b)


@pytest.mark.interpreter
@pytest.mark.parametrize("draft", ["probs", "logits", None])
def test_triton_path_gives_the_references_tokens(draft):
    """The statistics, the pass that writes the processed rows, then the tree kernel (under the
    interpreter on CPU)."""
    from specops.tree.launch import tree_speculative_sampling_from_logits_triton

    (q, draft_logits), ids, parents, target = logits_inputs(2, 6, 64, draft, seed=5,
                                                            device=DEVICE)
    seed, offset = seeds(2, per_request=True)
    every = (torch.tensor([0.7, 0.0]), torch.tensor([3, 0]), torch.tensor([0.8, 1.0]),
             torch.tensor([0.1, 0.0]))  # every truncation at once, and a greedy request
    args = (q, ids, parents, target, draft_logits, seed, offset,
            *(x.to(DEVICE) for x in every), True)
    expected = tree_speculative_sampling_from_logits_reference(*args)
    got = tree_speculative_sampling_from_logits_triton(*args)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


@triton.jit
def row_pass(p_row, q_row, stats, out, w, vocab, GROUP: tl.constexpr, CHUNK: tl.constexpr):
    """masses_residual over a row pair's chunks, both rows logits that may be greedy."""
    res, p = masses_residual(p_row, q_row, w, 0, tl.cdiv(vocab, CHUNK), vocab, GROUP, CHUNK,
                             ONE_HOT, stats, ONE_HOT, stats + STATS)
    tl.store(out + tl.arange(0, GROUP), res)
    tl.store(out + GROUP + tl.arange(0, GROUP), p)


@pytest.mark.interpreter
@pytest.mark.parametrize("temperatures", [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)])
def test_row_passes_read_greedy_rows_one_hot(temperatures):
    """The row pass of a tree's rejection (core/sampling/race_triton.py's masses_residual), on
    logits read through their statistics, greedy rows one-hot (values_triton.ONE_HOT): its chunk
    masses of relu(w p - q) and of p are those of the processed rows, greedy on either side or
    both, the one-hot tokens in whole and partial chunks (V = 2500: chunks 0-1 whole, 2 not)."""
    from specops.core.logits.launch import row_statistics

    vocab, chunk, w = 2500, 1024, 0.75
    for hot in (5, 2400):  # the greedy tokens in a whole chunk, then in the partial one
        # p's row and q's, each a request of one row (its own temperature)
        logits = torch.randn(2, 1, vocab, generator=torch.Generator().manual_seed(hot))
        logits[:, 0, hot] = 4.0  # both rows' argmax: a greedy row's one-hot meets the other's
        stats = row_statistics(logits.to(DEVICE), torch.tensor(temperatures, device=DEVICE),
                               *(torch.tensor(v, device=DEVICE) for v in ([0, 0], [1.0, 1.0],
                                                                          [0.0, 0.0])))
        out = torch.zeros(8, device=DEVICE)
        row_pass[(1,)](logits[0, 0].to(DEVICE), logits[1, 0].to(DEVICE), stats, out, w, vocab,
                       GROUP=4, CHUNK=chunk)
        p, q = rule.processed_rows(logits[:, 0], torch.tensor(temperatures), torch.tensor([0, 0]),
                                   torch.ones(2), torch.zeros(2))
        padded = lambda x: torch.nn.functional.pad(x, (0, 4 * chunk - vocab)).view(4, chunk)
        expected = torch.cat([padded((w * p - q).clamp(min=0)).sum(-1), padded(p).sum(-1)])
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.interpreter
@pytest.mark.parametrize("verification", ["token", "traversal"])
@pytest.mark.parametrize("temperatures", [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)])
def test_triton_greedy_rows_are_one_hot_in_every_pass(verification, temperatures, monkeypatch):
    """Greedy target or draft rows (temperature 0 on either side or both) read by the kernels'
    passes as one-hot rows: a residual where both argmaxes agree has no mass, so the token comes
    from the target's row; where they differ, from the residual; a child at the argmax is kept.
    Against the reference, token for token, the passes taking their chunks two at a time (three
    chunks: a greedy token's chunk in either group, or in the partial last chunk)."""
    from specops.tree import launch
    from specops.tree.op import _reference
    from specops.tree.processed import on_processed_rows

    monkeypatch.setattr(launch, "GROUP", 2)
    g = torch.Generator().manual_seed(8)
    batch, vocab, parents = 6, 2100, full_tree(2, 2)
    # Sharp rows: a residual without a greedy draft's token differs from one with it.
    target = 4 * torch.randn(batch, len(parents) + 1, vocab, generator=g)
    draft = torch.where(torch.arange(batch)[:, None, None] < 3, target,
                        4 * torch.randn(batch, len(parents) + 1, vocab, generator=g))
    judged = torch.tensor(parents)  # each node's parent's row: where it is judged
    pick = torch.rand(batch, len(parents), generator=g)
    ids = torch.where(pick < 0.15, target[:, judged].argmax(-1), torch.where(
        pick < 0.85, draft[:, judged].argmax(-1),  # a greedy drafter's, often twice
        torch.randint(0, vocab, (batch, len(parents)), generator=g)))
    target_t, draft_t = (torch.tensor([t]) for t in temperatures)
    args = (None, ids, torch.tensor(parents).expand(batch, -1), target, draft,
            torch.arange(batch), torch.zeros(1, dtype=torch.int64), target_t,
            torch.zeros(1, dtype=torch.int64), torch.ones(1), torch.zeros(1), True, draft_t,
            *(None,) * 10, "vllm", verification)
    expected = on_processed_rows(_reference)(*args)
    got = launch.tree_speculative_sampling_from_logits_triton(
        *(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args))
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, expected))
    assert (expected[2] > 0).any() and (expected[2] < 2).any()  # drafts kept and rejected
