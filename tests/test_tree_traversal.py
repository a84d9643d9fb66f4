"""Traversal verification of trees (docs/tree.md, "Traversal verification"): exact, sequence by
sequence, for every construction it takes, from probabilities and from logits; a variant judging
each node by its own ratio instead of its path's fails the same test; on a chain it has block
verification's distribution; it keeps more tokens per call than token verification where draft
probabilities are given; target-only it is the token rule; the op's registration, checks and
CPU backend."""

from __future__ import annotations

import pytest
import torch

import specops
from specops.demo.stats import chi2_pvalue
from specops.tree import cpu, reference, slots
from specops.tree import traversal_reference as traversal

import test_tree_statistics as tree_stats  # tests/test_tree_statistics.py: its decoding
import worlds  # tests/worlds.py
from inputs import full_tree, tree_inputs  # tests/inputs.py

OP = torch.ops.specops.tree_speculative_sampling
LOGITS_OP = torch.ops.specops.tree_speculative_sampling_from_logits

# (V, width, depth, seed, scale): the token rule's two worlds and a binary tree of depth 4.
WORLDS = tree_stats.WORLDS + [(3, 2, 4, 5, 2.0)]


def traversal_op(mode, from_logits=False):
    """The public function, verification="traversal", for a tree built by ``mode``'s sampling
    (from the rows' logarithms as logits, the draft's as draft_logits, when ``from_logits``)."""
    def run(draft_probs, ids, parents, target_probs, seed, offset):
        kwargs = dict(seed=seed, offset=offset, with_replacement=mode != "without",
                      verification="traversal")
        if from_logits:
            return specops.tree_speculative_sampling_from_logits(
                None, ids, parents, target_probs.log(), draft_logits=draft_probs.log(), **kwargs)
        return specops.tree_speculative_sampling(draft_probs, ids, parents, target_probs,
                                                 **kwargs)
    return run


def own_ratio(state, p_x, q_x):
    """A wrong rule: each node judged by its own ratio min(1, B(x) / Q(x)), not its path's."""
    return traversal.child_value(state._replace(value=torch.ones_like(state.value)), p_x, q_x)


def broken_op(mode):
    def run(draft_probs, ids, parents, target_probs, seed, offset):
        seed, offset = torch.tensor([seed]), torch.tensor([offset])
        vocab = target_probs.shape[2]
        tree = reference.read_tree(ids, parents, vocab)
        coins = reference.request_uniforms(seed, offset, ids.shape[0], 2 * ids.shape[1],
                                           slots.coin_slot(vocab, 1))[:, ::2]
        walk, state = traversal.traverse(draft_probs, target_probs, tree, coins,
                                         mode != "without", value_of=own_ratio)
        last = reference.Round(state.rejections, state.weight, state.scale, state.mass)
        token = reference.draw_token(draft_probs, target_probs, walk, last, seed, offset)
        return reference.write_outputs(tree, walk, token)
    return run


@pytest.mark.parametrize("mode", ["iid", "without"])
@pytest.mark.parametrize("vocab,width,depth,seed,scale", WORLDS)
def test_sequences_follow_the_target(mode, vocab, width, depth, seed, scale):
    p, q = tree_stats.make_world(vocab, depth, seed, scale)
    tokens = tree_stats.decode(traversal_op(mode), p, q, width, depth, mode, seed)
    assert worlds.joint_pvalue(tokens, p) > tree_stats.P_THRESHOLD


@pytest.mark.parametrize("mode", ["iid", "without"])
def test_one_call_follows_the_target_where_rows_depend_on_the_whole_path(mode):
    """Rows that depend on every token before them (not only on the position), a binary tree of
    depth 2 drawn from them: the first 3 tokens of one call's output, completed by the target
    where the call emitted fewer, follow the target's joint distribution. A rule reading a row
    of another node at the same depth would not."""
    vocab, length, requests = 3, 3, 60000
    g = torch.Generator().manual_seed(8)
    # Row tables by prefix: a prefix t_1 .. t_k is the code sum_i (t_i + 1) (V + 1)^(k - i).
    codes = (vocab + 1) ** length
    p = torch.softmax(2.0 * torch.randn(codes, vocab, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2.0 * torch.randn(codes, vocab, generator=g, dtype=torch.float64), -1)
    parents = full_tree(2, 2)
    code = torch.zeros(requests, parents.shape[0] + 1, dtype=torch.int64)
    ids = torch.zeros(requests, parents.shape[0], dtype=torch.int64)
    for node in range(parents.shape[0] + 1):
        kids = (parents == node).nonzero().squeeze(1)
        if kids.numel():
            ids[:, kids] = tree_stats.children_tokens(q[code[:, node]], kids.numel(), mode, g)
            code[:, kids + 1] = code[:, node, None] * (vocab + 1) + ids[:, kids] + 1
    out, _, _ = specops.tree_speculative_sampling(
        q[code].float(), ids, parents.expand(requests, -1), p[code].float(),
        seed=torch.arange(requests), with_replacement=mode != "without",
        verification="traversal")
    tokens = out[:, :length].long()
    prefix = torch.zeros(requests, dtype=torch.int64)
    for t in range(length):
        drawn = tree_stats.draw(p[prefix], g)
        tokens[:, t] = torch.where(tokens[:, t] >= 0, tokens[:, t], drawn)
        prefix = prefix * (vocab + 1) + tokens[:, t] + 1
    # The target's joint probability of every sequence of ``length`` tokens, index sum t_i V^i.
    sequences = torch.cartesian_prod(*[torch.arange(vocab)] * length)
    expected = torch.ones(sequences.shape[0], dtype=torch.float64)
    prefix = torch.zeros(sequences.shape[0], dtype=torch.int64)
    for t in range(length):
        expected = expected * p[prefix, sequences[:, t]]
        prefix = prefix * (vocab + 1) + sequences[:, t] + 1
    index = (sequences * vocab ** torch.arange(length)).sum(1)
    counts = torch.bincount((tokens * vocab ** torch.arange(length)).sum(1),
                            minlength=vocab ** length)
    assert chi2_pvalue(counts, expected[index.argsort()]) > tree_stats.P_THRESHOLD


@pytest.mark.parametrize("mode", ["iid", "without"])
def test_sequences_from_logits_follow_the_target(mode):
    vocab, width, depth, seed, scale = WORLDS[0]
    p, q = tree_stats.make_world(vocab, depth, seed, scale)
    tokens = tree_stats.decode(traversal_op(mode, from_logits=True), p, q, width, depth, mode,
                               seed)
    assert worlds.joint_pvalue(tokens, p) > tree_stats.P_THRESHOLD


@pytest.mark.parametrize("mode,world", [("iid", WORLDS[0]), ("without", WORLDS[1])])
def test_detector_catches_nodes_judged_by_their_own_ratio(mode, world):
    vocab, width, depth, seed, scale = world
    p, q = tree_stats.make_world(vocab, depth, seed, scale)
    tokens = tree_stats.decode(broken_op(mode), p, q, width, depth, mode, seed)
    assert worlds.joint_pvalue(tokens, p) < tree_stats.P_THRESHOLD


def test_detector_catches_the_wrong_draft_update():
    """Children drawn without replacement but verified as drawn i.i.d. (the draft row not
    updated after a rejection): biased, and the test sees it."""
    vocab, width, depth, seed, scale = WORLDS[1]
    p, q = tree_stats.make_world(vocab, depth, seed, scale)
    iid_rule = traversal_op("iid")
    tokens = tree_stats.decode(iid_rule, p, q, width, depth, "without", seed)
    assert worlds.joint_pvalue(tokens, p) < tree_stats.P_THRESHOLD


# ----------------------------------------------------------------------------------------------
# On a chain, traversal verification is block verification.


def chain_outcomes(out: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counts of (drafts accepted e, the token after them) over the requests' outputs."""
    e = (out >= 0).sum(1) - 1
    token = out.long().gather(1, e[:, None]).squeeze(1)
    return torch.bincount(e * vocab + token, minlength=out.shape[1] * vocab)


@pytest.mark.parametrize("replacement", [True, False])
def test_a_chain_has_block_verifications_distribution(replacement):
    """Chains of drafts drawn from the draft rows: (accepted length, next token) of the tree op
    on the chain (parents[i] = i) and of the chain op with block verification agree (a
    two-sample test); token verification, which keeps fewer, does not (the test can tell)."""
    vocab, num_draft, requests = 4, 4, 30000
    p, q = worlds.make_world(vocab, num_draft + 1, 31, 1.5)
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([tree_stats.draw(q[j].expand(requests, -1), g) for j in range(num_draft)],
                      dim=1)
    target, draft = p.float().expand(requests, -1, -1), q.float().expand(requests, -1, -1)
    parents = torch.arange(num_draft).expand(requests, -1)
    tree, _, _ = specops.tree_speculative_sampling(draft, ids, parents, target, seed=1,
                                                   with_replacement=replacement,
                                                   verification="traversal")
    block, _, _ = specops.chain_speculative_sampling(draft[:, :-1], ids, target, seed=2,
                                                     verification="block")
    token, _, _ = specops.chain_speculative_sampling(draft[:, :-1], ids, target, seed=3)
    tree, block, token = (chain_outcomes(out, vocab) for out in (tree, block, token))
    assert worlds.two_sample_pvalue(tree, block) > tree_stats.P_THRESHOLD
    assert worlds.two_sample_pvalue(token, block) < tree_stats.P_THRESHOLD


# ----------------------------------------------------------------------------------------------
# Tokens per call.


def emitted_both_ways(mode, world, requests=20000):
    """(token verification's emitted, traversal's) for the same trees and seeds."""
    p, q = tree_stats.make_world(4 + world % 2, 3, 20 + world, 0.5 + world / 2)
    trees = tree_stats.build_trees(p, q, torch.zeros(requests, dtype=torch.int64),
                                   2 + world % 2, 3, mode, torch.Generator().manual_seed(world))
    draft, ids, parents, target = trees
    draft = None if mode == "top-k" else draft
    return [specops.tree_speculative_sampling(draft, ids, parents, target, seed=7 + world,
                                              with_replacement=mode != "without",
                                              verification=v)[2].double()
            for v in ("token", "traversal")]


@pytest.mark.parametrize("mode", ["iid", "without"])
def test_traversal_keeps_more_tokens_per_call(mode):
    """With draft probabilities (where the paper predicts a gain) traversal keeps more drafts per
    call than token verification in every world, by more than four standard errors."""
    for world in range(6):
        token, traversal_ = emitted_both_ways(mode, world)
        gain = traversal_ - token
        assert float(gain.mean()) > 4 * float(gain.std()) / gain.numel() ** 0.5, (mode, world)


def test_target_only_traversal_is_the_token_rule():
    """Without draft probabilities no exact rule keeps a path more often than the target's
    probability of it, which the token rule already does: traversal is the token rule there,
    token for token."""
    q, ids, parents, p = tree_inputs(6, 6, 30, draft=False, parents=full_tree(2, 2), seed=3)
    seed, offset = torch.arange(6) + 5, torch.tensor([1])
    for replacement in (True, False):
        a = OP(None, ids, parents, p, seed, offset, replacement, "traversal")
        b = OP(None, ids, parents, p, seed, offset, replacement, "token")
        assert all(torch.equal(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------------------------
# The op: registration, checks, the CPU backend, outputs.


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(replacement, dtype):
    q, d, par, p = tree_inputs(5, 7, 40, dtype=dtype, device="cpu")
    d[1, 2] = -1  # an absent node (and its subtree), an id >= V, a malformed parent
    d[2, 0] = 40
    par[3, 4] = 6
    torch.library.opcheck(OP, (q, d, par, p, torch.arange(5) * 7, torch.tensor([2]),
                               replacement, "traversal"))


def test_opcheck_from_logits():
    q, d, par, p = tree_inputs(4, 6, 30, parents=full_tree(2, 2), device="cpu")
    ones = torch.ones(1)
    torch.library.opcheck(LOGITS_OP, (None, d, par, p.log(), q.log(), torch.tensor([3]),
                                      torch.tensor([0]), ones * 0.8, torch.tensor([0]), ones,
                                      ones * 0, False, None, None, None, None, None, None, None,
                                      None, None, None, None, "vllm", "traversal"))


def random_trees(trial: int, batch=8, num_nodes=9, vocab=50):
    """Trees of every shape, absent nodes, duplicate siblings and rows without mass."""
    g = torch.Generator().manual_seed(trial)
    q, ids, parents, p = tree_inputs(batch, num_nodes, vocab, sharp=3.0, seed=trial)
    parents = (torch.rand(batch, num_nodes, generator=g) * (torch.arange(num_nodes) + 1)).long()
    ids[0, 3] = -1
    ids[1, 1] = ids[1, 0]  # a duplicate sibling where both hang from the same node
    parents[1, 1] = parents[1, 0]
    p[2, 0] = 0.0  # a root without target mass
    q[3, 0] = p[3, 0]  # a root whose draft is its target
    return q, ids, parents, p


@pytest.mark.parametrize("replacement", [True, False])
def test_cpu_backend_gives_the_references_tokens(replacement):
    for trial in range(6):
        q, ids, parents, p = random_trees(trial)
        seed, offset = torch.arange(8) * 13 + trial, torch.tensor([trial])
        expected = traversal.verify(q, ids, parents, p, seed, offset, replacement)
        got = cpu.tree_speculative_sampling_cpu(q, ids, parents, p, seed, offset, replacement,
                                                "traversal")
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_outputs_are_a_path_of_the_tree():
    """Every output is a path from the root: each kept node's parent is the one before it, the
    tokens are the nodes', and the count is the path's length."""
    for trial in range(6):
        q, ids, parents, p = random_trees(trial)
        tokens, nodes, emitted = OP(q, ids, parents, p, torch.tensor([trial]),
                                    torch.tensor([0]), True, "traversal")
        for b in range(ids.shape[0]):
            path = [n for n in nodes[b].tolist() if n > 0]
            assert len(path) == int(emitted[b])
            assert nodes[b, len(path):].eq(-1).all()
            previous = 0
            for depth, node in enumerate(path):
                assert int(parents[b, node - 1]) == previous
                assert int(tokens[b, depth]) == int(ids[b, node - 1])
                previous = node
            assert tokens[b, len(path) + 1:].eq(-1).all()


def test_leaf_draft_rows_are_not_read():
    q, ids, parents, p = tree_inputs(4, 6, 30, parents=full_tree(2, 2), seed=2)
    leaves = [n + 1 for n in range(6) if not bool((parents[0] == n + 1).any())]
    poisoned = q.clone()
    poisoned[:, leaves] = float("nan")
    seed, offset = torch.tensor([4]), torch.tensor([0])
    a = OP(q, ids, parents, p, seed, offset, True, "traversal")
    b = OP(poisoned, ids, parents, p, seed, offset, True, "traversal")
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_bad_verification_is_named_eagerly_and_at_trace_time():
    q, ids, parents, p = tree_inputs(2, 3, 8)
    with pytest.raises(ValueError, match="verification must be"):
        specops.tree_speculative_sampling(q, ids, parents, p, seed=0, verification="block")
    with pytest.raises(ValueError, match="verification must be"):
        specops.tree_speculative_sampling_from_logits(q, ids, parents, p.log(), seed=0,
                                                      verification="leaves")

    def call(q, ids, parents, p):
        return OP(q, ids, parents, p, torch.tensor([0]), torch.tensor([0]), True, "paths")

    with pytest.raises(Exception, match="verification must be"):
        torch.compile(call, fullgraph=True, backend="aot_eager")(q, ids, parents, p)


def test_lossy_acceptance_is_refused_naming_verification():
    q, ids, parents, p = tree_inputs(2, 3, 8)
    with pytest.raises(ValueError, match="verification='traversal' takes the exact"):
        specops.tree_speculative_sampling_from_logits(
            None, ids, parents, p.log(), seed=0, acceptance="typical",
            verification="traversal")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_call_equals_eager(backend):
    q, ids, parents, p = tree_inputs(4, 6, 30, parents=full_tree(2, 2), seed=5)

    def call(q, ids, parents, p):
        return specops.tree_speculative_sampling(q, ids, parents, p, seed=9,
                                                 verification="traversal")

    compiled = torch.compile(call, fullgraph=True, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(compiled(q, ids, parents, p),
                                                 call(q, ids, parents, p)))
