"""Vocabulary-parallel verification (specops.distributed) in real gloo process groups of 2 and 3
ranks on loopback (tests/distributed_cases.py spawns them): the single-device tokens and counters
bit for bit on chunk-aligned shards, the same on every rank, the distribution on shards that split
chunks, a fixed number of small collectives whatever V, and bad layouts, or ranks given other
seeds, offsets or draft ids, refused on every rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distributed_cases import spawn
from specops.demo.stats import chi2_pvalue

P_THRESHOLD = 1e-4
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return spawn(2, "two_ranks", tmp_path_factory.mktemp("two"))


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return spawn(3, "three_ranks", tmp_path_factory.mktemp("three"))


def assert_exact(results):
    for rank, result in enumerate(results):
        assert len(result["exact"]) >= 8
        for case, (ours, single) in result["exact"].items():
            for name, a, b in zip(("tokens", "accepted", "emitted"), ours, single):
                assert torch.equal(a, b), (f"rank {rank}, {case}: {name} {a.tolist()} differ from "
                                           f"the single-device {b.tolist()}")


def test_aligned_shards_give_the_single_device_tokens(two):
    assert_exact(two)


def test_aligned_shards_in_any_rank_order_and_on_a_subgroup(three):
    """Also: shards cut inside chunks at the same places give the same tokens on 3 ranks as on
    a subgroup of 2 (the number of ranks never matters beyond where boundaries fall)."""
    assert_exact(three)
    assert any(case.startswith("subgroup") for case in three[0]["exact"])
    assert any(case.startswith("3 ranks against 2") for case in three[0]["exact"])


def test_every_rank_returns_the_same_outputs_also_with_a_drawn_seed(three):
    for result in three[1:]:
        assert all(torch.equal(a, b) for a, b in zip(result["drawn"], three[0]["drawn"]))
        for case, (ours, _) in result["exact"].items():
            assert all(torch.equal(a, b) for a, b in zip(ours, three[0]["exact"][case][0]))


@pytest.mark.parametrize("mode", ["token", "block"])
def test_shards_that_split_chunks_keep_the_distribution(three, mode):
    p, first, second = three[0]["statistics"][mode]
    assert chi2_pvalue(first, p[0]) > P_THRESHOLD
    if mode == "token":  # the bonus token after an accepted draft follows p_1
        assert chi2_pvalue(second, p[1]) > P_THRESHOLD
    for other in three[1:]:
        assert torch.equal(other["statistics"][mode][1], first)


def test_aligned_shards_process_logits_as_one_device_does(two):
    """Every parameter at once (greedy rows, min-p, top-k, top-p), then the whole sampling step
    too (mask, bias, penalties counting drafts of both shards, the draft's own parameters,
    transformers' order): the rows bit for bit, so the thresholds are the single-device ones."""
    assert len(two[0]["processed"][0]) == 4
    for rank, result in enumerate(two):
        for ours, single in zip(*result["processed"]):
            assert torch.equal(ours, single), f"rank {rank}: processed rows differ"


def test_aligned_shards_give_the_single_device_logprobs(two):
    """Processed (the sampling step, top-k, top-p, a greedy request) and raw: the tokens, the
    logprobs and the top tokens bit for bit, on every rank."""
    for rank, result in enumerate(two):
        for mode, (ours, single) in result["logprobs"].items():
            assert len(ours) == 6 and (single[0][:, 1:] >= 0).any(), mode
            for name, a, b in zip(("tokens", "accepted", "emitted", "logprobs", "top ids",
                                   "top logprobs"), ours, single):
                assert torch.equal(a, b), f"rank {rank}, {mode}: {name} differ"


def test_shards_that_split_chunks_process_logits_as_one_device_does(three):
    """Every parameter at once, shards cut at 700 and 1500: the same kept tokens, the same
    weights within float32 rounding of the kept mass (summed over other groups of columns)."""
    for rank, result in enumerate(three):
        for ours, single in zip(*result["processed"]):
            assert torch.equal(ours > 0, single > 0), f"rank {rank}: other tokens kept"
            torch.testing.assert_close(ours, single, rtol=1e-6, atol=0)


# The documented counts (docs/api.md, "Vocabulary-parallel verification").
EXPECTED = {"token": 3, "block": 4, "token seed=None": 4, "logits plain": 5,
            "logits top-k": 5 + 8, "logits all block": 6 + 8 + 31}


@pytest.mark.parametrize("call", sorted(EXPECTED))
def test_collectives_are_few_small_and_independent_of_the_vocabulary(two, call):
    for rank, result in enumerate(two):
        small, large = result["collectives"][call]
        assert small == large, f"rank {rank}, {call}: the collectives change with V"
        assert len(small) == EXPECTED[call], (call, small)
        batch, positions = 4, 4  # B, N + 1 of the recorded calls
        rows = batch * (positions + positions - 1)  # target and draft rows
        assert max(numel for _, numel, _ in small) <= 15 * rows, small  # top-k's histogram
        assert small[0][0] == "all_gather"  # the layout exchange comes first


def messages(two, case):
    return [result["bad"][0][case] for result in two]


def test_refusals_come_at_once_not_after_a_timeout(two):
    for result in two:
        assert max(result["bad"][1].values()) < 10, result["bad"][1]  # the group's timeout: 60 s


def test_an_empty_batch_runs(two):
    assert messages(two, "empty batch") == [None, None]
    assert messages(two, "empty batch, logprobs") == [None, None]


def test_searches_follow_the_draft_parameters_too(two):
    """A target parameter given as 0 on one rank and as a tensor holding 0 on another, with the
    draft's own top-k: every rank makes the same searches (no collective mismatch)."""
    assert messages(two, "top_k in two forms, draft_top_k") == [None, None]


@pytest.mark.parametrize("case, argument", [
    ("gap", "vocab_start"), ("overlap", "vocab_start"), ("start outside", "vocab_start"),
    ("short of vocab_size", "vocab_start"), ("batch", "target_probs"),
    ("num_draft", "target_probs"), ("vocab_size", "vocab_size"),
    ("negative vocab_start", "vocab_start"), ("huge vocab_start", "vocab_start"),
    ("offsets", "offset"),
])
def test_bad_layouts_raise_a_value_error_naming_the_argument_on_every_rank(two, case, argument):
    for outcome in messages(two, case):
        assert outcome is not None, f"{case}: a rank did not raise"
        kind, message = outcome
        assert kind == "ValueError" and argument in message, outcome


def test_a_rank_refusing_its_own_arguments_is_named_on_the_others(two):
    (kind0, message0), (kind1, message1) = messages(two, "local")
    assert kind1 == "TypeError" and message1.startswith("draft_token_ids")
    assert kind0 == "ValueError" and "draft_token_ids" in message0 and "rank 1" in message0


def test_validation_mode_refuses_bad_values_on_every_rank(two):
    (kind0, message0), (kind1, message1) = messages(two, "validate nan")
    assert kind1 == "ValueError" and message1.startswith("target_probs must be finite")
    assert kind0 == "ValueError" and "target_probs" in message0 and "rank 1" in message0
    for kind, message in messages(two, "validate id"):
        assert kind == "ValueError" and message.startswith("draft_token_ids must be -1")
        assert "[0, 3000)" in message
    assert messages(two, "validate padding") == [None, None]  # NaN past vocab_size is not read
    assert messages(two, "validate int32 ids") == [None, None]  # legal ids of either dtype
    for kind, message in messages(two, "validate mass"):  # the whole row's, over the ranks
        assert kind == "ValueError" and message.startswith("target_probs must hold probability")
        assert "row at index (1, 0)" in message


def test_the_group_works_after_refusals(two):
    assert messages(two, "good") == [None, None]


@pytest.mark.parametrize("case, argument", [
    ("other seed", "seed"), ("other per-request seeds, block", "seed"),
    ("other offset, one-hot drafts", "offset"), ("other offset, seed=None", "offset"),
    ("other seed, logits", "seed"), ("other per-request offsets, logits block", "offset"),
    ("other ids", "draft_token_ids"), ("swapped ids, block", "draft_token_ids"),
    ("+1 -2 +1 ids, logits", "draft_token_ids"), ("other ids, logits block", "draft_token_ids"),
    ("other temperature, logits", "temperature"),
    ("other per-request top_p, logits block", "top_p"),
    ("other draft_temperature, logits", "draft_temperature"),
    ("other repetition_penalty, logits", "repetition_penalty"),
    ("other allowed_token_bitmask, logits", "allowed_token_bitmask"),
])
def test_ranks_given_other_seeds_offsets_or_draft_ids_raise_the_same_error(two, case, argument):
    """Otherwise every rank would return other tokens."""
    first, second = messages(two, case)
    assert first is not None and first == second, (first, second)
    kind, message = first
    assert kind == "ValueError" and message.startswith(f"{argument}: the ranks disagree"), message
    assert f"every rank must pass the same {argument}" in message and "rank(s) [1]" in message


@pytest.mark.parametrize("case", ["same values", "same values, logits", "offset None and 0",
                                  "same parameters in other forms, logits"])
def test_ranks_given_the_same_seeds_offsets_and_draft_ids_in_other_forms_run(two, case):
    assert messages(two, case) == [None, None]


def test_the_layout_record_is_the_size_the_docs_give():
    from pathlib import Path

    from specops.distributed.comm import Record

    api = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    assert f"| all_gather of the layout | {len(Record._fields)} int64 |" in api


def test_fingerprints_tell_apart_what_plain_sums_confuse():
    """Swapped, shifted or +1 / -2 / +1 ids, and any one of 64-bit seeds changed; the same
    values in int32 and int64 agree."""
    from specops.distributed.comm import fingerprints

    def prints(*values):
        return fingerprints(values, torch.device("cpu")).tolist()

    ids = torch.tensor([[10, 20, 30], [7, 7, 9]])
    for other in ([[20, 10, 30], [7, 7, 9]], [[11, 18, 31], [7, 7, 9]],
                  [[7, 7, 9], [10, 20, 30]], [[20, 30, 7], [7, 9, 10]]):
        assert prints(torch.tensor(other)) != prints(ids), other
    assert prints(ids.int()) == prints(ids)
    seeds = torch.randint(-2**63, 2**63 - 1, (16,), generator=torch.Generator().manual_seed(0))
    for k in range(16):
        for step in (1, -1, 2**63 - 1, -2**63):
            other = seeds.clone()
            other[k] += step
            assert prints(other) != prints(seeds), (k, step)
    assert prints(None, None, ids) == [0, 0, 0, 0, *prints(ids)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                    reason="needs a CUDA device and NCCL")
def test_cuda_graph_capture_with_nccl_collectives(tmp_path):
    world = min(2, torch.cuda.device_count())
    for rank, result in enumerate(spawn(world, "nccl_graph", tmp_path, backend="nccl")):
        for verification, (same, follows) in result.items():
            assert same, f"rank {rank}, {verification}: a replay differs from the eager call"
            assert follows, f"rank {rank}, {verification}: a replay ignores the new offsets"
