"""The tree op's bad input: errors naming the argument, the same in eager mode, under fake tensors
and at trace time; SPECOPS_VALIDATE=1's value checks (malformed parents name ``parents``); the
default mode's tolerance (a malformed node is an absent one); warmup's tree arguments."""

from __future__ import annotations

import pytest
import torch

import specops
from specops.tree.arguments import check_arguments

from tracing import (assert_same_error_under_compile, assert_same_error_under_fake_tensors,  # tests/
                     message_of, with_one_changed)

OP = torch.ops.specops.tree_speculative_sampling
B, M, V = 3, 4, 5


def good_args():
    return dict(draft_probs=torch.full((B, M + 1, V), 1.0 / V),
                draft_token_ids=torch.tensor([[0, 1, 2, 3]] * B),
                parents=torch.tensor([[0, 0, 1, 2]] * B),
                target_probs=torch.full((B, M + 1, V), 1.0 / V),
                seed=torch.tensor([1]), offset=torch.tensor([0]), with_replacement=True)


ARG_ORDER = list(good_args())

# (id, argument to replace, replacement, exception type, fragments the message must contain)
BAD = [
    ("target rank 2", "target_probs", torch.zeros(B, V), ValueError,
     ["target_probs", "(batch_size, num_nodes + 1, vocab_size)", "(3, 5)"]),
    ("target one row", "target_probs", torch.zeros(B, 1, V), ValueError,
     ["target_probs", "num_nodes + 1 >= 2", "(3, 1, 5)"]),
    ("target dtype", "target_probs", torch.zeros(B, M + 1, V, dtype=torch.float64), TypeError,
     ["target_probs", "float32", "float64"]),
    ("target vocab 0", "target_probs", torch.zeros(B, M + 1, 0), ValueError,
     ["target_probs", "vocab_size >= 1"]),
    ("ids rank 1", "draft_token_ids", torch.zeros(B * M, dtype=torch.int64), ValueError,
     ["draft_token_ids", "(3, 4)", "(12,)"]),
    ("ids nodes", "draft_token_ids", torch.zeros(B, M + 1, dtype=torch.int64), ValueError,
     ["draft_token_ids", "(3, 4)", "(3, 5)", "num_nodes + 1 rows"]),
    ("ids float", "draft_token_ids", torch.zeros(B, M), TypeError,
     ["draft_token_ids", "int32 or int64", "float32"]),
    ("parents batch", "parents", torch.zeros(B + 1, M, dtype=torch.int64), ValueError,
     ["parents", "(3, 4)", "(4, 4)"]),
    ("parents int16", "parents", torch.zeros(B, M, dtype=torch.int16), TypeError,
     ["parents", "int32 or int64", "int16"]),
    ("parents not a tensor", "parents", [[0, 0, 1, 2]] * B, TypeError,
     ["parents must be a tensor", "list"]),
    ("draft rows", "draft_probs", torch.zeros(B, M, V), ValueError,
     ["draft_probs", "(batch_size, num_nodes + 1, vocab_size) = (3, 5, 5)", "(3, 4, 5)"]),
    ("draft dtype", "draft_probs", torch.zeros(B, M + 1, V, dtype=torch.float16), TypeError,
     ["draft_probs", "float32", "float16"]),
    ("seed size", "seed", torch.zeros(2, dtype=torch.int64), ValueError,
     ["seed", "1 or batch_size (3)", "(2,)"]),
    ("offset dtype", "offset", torch.zeros(1, dtype=torch.int32), TypeError,
     ["offset", "int64", "int32"]),
    ("with_replacement int", "with_replacement", 1, TypeError,
     ["with_replacement must be a bool", "int"]),
]


def bad_args(name, value):
    return with_one_changed(good_args(), ARG_ORDER, name, value)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_eager_message(case):
    _, name, value, exc, fragments = case
    message = message_of(exc, check_arguments, *bad_args(name, value))
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    # The public function names the same argument, with the same message.
    args = dict(zip(ARG_ORDER, bad_args(name, value)))
    if name != "with_replacement" and name not in ("seed", "offset"):
        public = lambda: specops.tree_speculative_sampling(  # noqa: E731
            args["draft_probs"], args["draft_token_ids"], args["parents"], args["target_probs"],
            seed=1)
        assert message_of(exc, public) == message


TENSOR_CASES = [c for c in BAD if isinstance(c[2], torch.Tensor)]


@pytest.mark.parametrize("case", TENSOR_CASES, ids=[c[0] for c in TENSOR_CASES])
def test_bad_input_same_error_under_fake_tensors(case):
    _, name, value, exc, _ = case
    args = bad_args(name, value)
    assert_same_error_under_fake_tensors(OP, args, exc, message_of(exc, check_arguments, *args))


@pytest.mark.parametrize("case", TENSOR_CASES[::2], ids=[c[0] for c in TENSOR_CASES[::2]])
def test_bad_input_same_error_under_compile(case):
    _, name, value, exc, _ = case
    args = bad_args(name, value)
    assert_same_error_under_compile(OP, args, exc, message_of(exc, check_arguments, *args))


def _compiled_call(*args):
    return OP(*args)


# ----------------------------------------------------------------------------------------------
# SPECOPS_VALIDATE=1


def run(**changes):
    args = good_args()
    args.update(changes)
    return specops.tree_speculative_sampling(
        args["draft_probs"], args["draft_token_ids"], args["parents"], args["target_probs"],
        seed=1)


def _parents(*rows):
    return torch.tensor(rows)


@pytest.mark.parametrize("what,changes,fragments", [
    ("parent after the node", dict(parents=_parents([0, 0, 3, 2], [0, 0, 1, 2], [0, 0, 1, 2])),
     ["parents", "[0, i]", "got 3 for node 3", "(0, 2)"]),
    ("parent -1", dict(parents=_parents([0, 0, 1, 2], [0, -1, 1, 2], [0, 0, 1, 2])),
     ["parents", "got -1 for node 2", "(1, 1)"]),
    ("parent of node 1", dict(parents=_parents([0, 0, 1, 2], [0, 0, 1, 2], [1, 0, 1, 2])),
     ["parents", "got 1 for node 1"]),
    ("id -2", dict(draft_token_ids=torch.tensor([[0, 1, -2, 3]] * B)),
     ["draft_token_ids", "-2", "[0, 5)"]),
    ("target nan on the root", dict(target_probs=torch.full((B, M + 1, V), 0.2).index_put_(
        (torch.tensor([1]), torch.tensor([0]), torch.tensor([2])), torch.tensor(float("nan")))),
     ["target_probs", "nan", "rows the op reads"]),
    ("draft negative", dict(draft_probs=torch.full((B, M + 1, V), 0.2).index_put_(
        (torch.tensor([2]), torch.tensor([1]), torch.tensor([4])), torch.tensor(-0.5))),
     ["draft_probs", "-0.5"]),
    ("target doubled", dict(target_probs=torch.full((B, M + 1, V), 0.4)),
     ["target_probs", "sums to 2", "(0, 0)"]),
    ("draft softmax over the nodes", dict(draft_probs=torch.softmax(
        torch.arange(B * (M + 1) * V, dtype=torch.float32).reshape(B, M + 1, V), dim=1)),
     ["draft_probs", "(0, 0)", "another dimension"]),
])
def test_validate_mode_raises(monkeypatch, what, changes, fragments):
    monkeypatch.delenv("SPECOPS_VALIDATE", raising=False)
    run(**changes)  # the default mode tolerates it
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    with pytest.raises(ValueError) as info:
        run(**changes)
    for fragment in fragments + ["SPECOPS_VALIDATE"]:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_validate_mode_raises_under_compile_at_run_time(monkeypatch):
    # The value checks read data, so a compiled graph runs them when the op runs.
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    torch._dynamo.reset()
    args = good_args()
    args["parents"] = _parents([0, 0, 1, 9], [0, 0, 1, 2], [0, 0, 1, 2])
    compiled = torch.compile(_compiled_call, fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match="parents must give node i"):
        compiled(*[args[k] for k in ARG_ORDER])


def test_validate_mode_accepts_padding_and_unread_rows(monkeypatch):
    monkeypatch.setenv("SPECOPS_VALIDATE", "1")
    args = good_args()
    ids = torch.tensor([[0, -1, 2, 3]] * B)  # node 2 absent; its parent may be anything
    parents = _parents([0, -7, 1, 2], [0, 9, 1, 2], [0, 0, 1, 2])
    p, q = args["target_probs"].clone(), args["draft_probs"].clone()
    p[:, 2] = float("nan")  # node 2's rows: absent, never read
    q[:, 2] = float("nan")
    q[:, 3:] = -1.0  # nodes 3 and 4 are leaves: their draft rows are not read
    parents[:, 3] = 1  # node 4 under node 1, beside node 3
    tokens, _, _ = specops.tree_speculative_sampling(q, ids, parents, p, seed=1)
    assert tokens.shape == (B, M + 1)
    p[:, 2] = 3.0  # finite, but no probability row: unread, so not checked either
    specops.tree_speculative_sampling(q, ids, parents, p, seed=1)


def test_default_mode_treats_a_malformed_node_as_absent(monkeypatch):
    monkeypatch.delenv("SPECOPS_VALIDATE", raising=False)
    g = torch.Generator().manual_seed(0)
    p = torch.rand(40, M + 1, V, generator=g)
    q = torch.rand(40, M + 1, V, generator=g)
    ids = torch.randint(0, V, (40, M), generator=g)
    parents = torch.tensor([[0, 0, 1, 2]] * 40)
    malformed, absent = parents.clone(), ids.clone()
    malformed[:, 2] = 5  # node 3's parent after it: node 3 and its child node 4 drop out
    absent[:, 2] = -1
    for draft in (q, None):
        assert all(torch.equal(a, b) for a, b in zip(
            specops.tree_speculative_sampling(draft, ids, malformed, p, seed=4),
            specops.tree_speculative_sampling(draft, absent, parents, p, seed=4)))


def test_public_function_names_its_arguments():
    args = good_args()
    with pytest.raises(TypeError, match="target_probs must be a tensor"):
        specops.tree_speculative_sampling(None, args["draft_token_ids"], args["parents"], None)
    with pytest.raises(TypeError, match="with_replacement must be a bool"):
        specops.tree_speculative_sampling(args["draft_probs"], args["draft_token_ids"],
                                          args["parents"], args["target_probs"],
                                          with_replacement="yes")
    with pytest.raises(ValueError, match=r"seed .*1 or batch_size \(3\)"):
        specops.tree_speculative_sampling(None, args["draft_token_ids"], args["parents"],
                                          args["target_probs"], seed=torch.tensor([1, 2]))
