"""Vocabulary-parallel cases run inside spawned gloo process groups (tests/test_distributed.py).

``spawn`` starts ``world`` processes on loopback, each running one scenario: many cases per group,
so that the few seconds a process takes to start are paid once. Each rank saves what it saw (its
outputs, the single-device outputs on the gathered tensors, the errors it raised, the collectives
it made) for the test to compare.
"""

from __future__ import annotations

import contextlib
import datetime
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = datetime.timedelta(seconds=60)
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "scatter", "barrier", "all_gather_object", "broadcast_object_list",
               "send", "recv", "isend", "irecv")


def _worker(rank: int, world: int, store_path: str, out_path: str, scenario: str,
            backend: str) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                            world_size=world, timeout=TIMEOUT)
    try:
        results = globals()[scenario](rank, world)
    except Exception:  # the test reports it
        results = {"crash": traceback.format_exc()}
    torch.save(results, f"{out_path}.{rank}")
    dist.destroy_process_group()


def spawn(world: int, scenario: str, tmp_path, timeout: float = 150.0,
          backend: str = "gloo") -> list[dict]:
    """Run ``scenario`` on ``world`` ranks (gloo; nccl: one GPU each); every rank's results, in
    rank order."""
    context = mp.get_context("spawn")
    out = str(tmp_path / scenario)
    processes = [context.Process(target=_worker, args=(r, world, str(tmp_path / "store"), out,
                                                       scenario, backend)) for r in range(world)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout)
    for p in processes:
        if p.is_alive():
            p.kill()
            raise AssertionError(f"{scenario}: a rank did not finish within {timeout} s")
    codes = [p.exitcode for p in processes]
    assert codes == [0] * world, f"{scenario}: the ranks exited with {codes}"
    results = [torch.load(f"{out}.{r}") for r in range(world)]
    for r, result in enumerate(results):
        assert "crash" not in result, f"rank {r}:\n{result['crash']}"
    return results


@contextlib.contextmanager
def recorded(log: list):
    """Record every torch.distributed collective made inside: (name, elements, dtype)."""
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def wrap(name, function):
        def recording(*args, **kwargs):
            tensor = args[0] if args else None
            if isinstance(tensor, list):  # all_gather(list, tensor): the sent tensor counts
                tensor = args[1]
            numel = tensor.numel() if isinstance(tensor, torch.Tensor) else -1
            log.append((name, numel, str(getattr(tensor, "dtype", None))))
            return function(*args, **kwargs)
        return recording

    for name, function in saved.items():
        setattr(dist, name, wrap(name, function))
    try:
        yield log
    finally:
        for name, function in saved.items():
            setattr(dist, name, function)


# ------------------------------------------------------------------------------------ inputs

def rows(shape, vocab, generator, sparse=4.0):
    """Random distributions (..., vocab), peaked (a power of uniforms)."""
    p = torch.rand(*shape, vocab, generator=generator) ** sparse
    return p / p.sum(-1, keepdim=True)


def chain_inputs(batch, num_draft, vocab, seed, padded_to=None):
    """(draft_probs, ids, target_probs) on the real vocabulary, the ids drawn from the draft with
    a -1 and an id >= vocab mixed in; and the padded tensors (columns past vocab full of junk)."""
    g = torch.Generator().manual_seed(seed)
    target = rows((batch, num_draft + 1), vocab, g)
    draft = rows((batch, num_draft), vocab, g)
    ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, num_draft)
    ids[0, -1] = -1
    ids[1 % batch, 0] = vocab + 3  # inside the padding: ends the draft
    width = padded_to or vocab

    def pad(t, value):
        return torch.nn.functional.pad(t, (0, width - vocab), value=value)

    return draft, ids, target, pad(draft, 0.5), pad(target, float("nan"))


def logits_inputs(batch, num_draft, vocab, seed, padded_to):
    """(draft_logits, ids, target_logits) and their padded twins (logit 0 past vocab, as vLLM's
    padded output layer gives)."""
    g = torch.Generator().manual_seed(seed)
    target = 3 * torch.randn(batch, num_draft + 1, vocab, generator=g)
    draft = 3 * torch.randn(batch, num_draft, vocab, generator=g)
    target[..., 5] = target[..., 1029]  # a tie at the peak across shards: the lower id wins
    ids = torch.multinomial(torch.softmax(draft.reshape(-1, vocab), -1), 1,
                            generator=g).reshape(batch, num_draft)
    ids[0, -1] = -1

    def pad(t):
        return torch.nn.functional.pad(t, (0, padded_to - vocab), value=0.0)

    return draft, ids, target, pad(draft), pad(target)


def shard_of(bounds: list, rank: int):
    """This rank's (start, end) in a layout given as one (start, end) per rank."""
    return bounds[rank]


def equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------------------------- scenarios

def probabilities_cases(rank, layout, vocab, padded_to, group=None, prefix=""):
    """Every probabilities case on one layout: (ours, single-device) outputs per case."""
    import specops
    import specops.distributed as sd

    start, end = shard_of(layout, rank)
    draft, ids, target, draft_pad, target_pad = chain_inputs(6, 3, vocab, 7, padded_to)
    seeds = {"seed": 11, "per-request": torch.arange(6, dtype=torch.int64) * 1000 + 5}
    results = {}
    for verification in ("token", "block"):
        for one_hot in (False, True):
            for seed_name, seed in seeds.items():
                single = specops.chain_speculative_sampling(
                    None if one_hot else draft, ids, target, seed=seed, offset=3,
                    verification=verification)
                ours = sd.chain_speculative_sampling(
                    None if one_hot else draft_pad[..., start:end], ids,
                    target_pad[..., start:end], seed=seed, offset=3,
                    verification=verification, vocab_start=start, vocab_size=vocab, group=group)
                results[f"{prefix}{verification} one_hot={one_hot} {seed_name}"] = (ours, single)
        # No drafts: one token from the single row.
        single = specops.chain_speculative_sampling(draft[:, :0], ids[:, :0], target[:, :1],
                                                    seed=11, offset=3, verification=verification)
        ours = sd.chain_speculative_sampling(
            draft_pad[:, :0, start:end], ids[:, :0], target_pad[:, :1, start:end], seed=11,
            offset=3, verification=verification, vocab_start=start, vocab_size=vocab, group=group)
        results[f"{prefix}{verification} no drafts"] = (ours, single)
    return results


PARAMETER_SETS = {
    "plain": dict(temperature=1.0),
    "all tensors": dict(temperature=torch.tensor([0.0, 0.7, 1.3, 1.0, 0.0, 2.0]),
                        top_k=torch.tensor([0, 5, 40, 2000, 3, 1]),
                        top_p=torch.tensor([1.0, 0.9, 0.5, 0.8, 1.0, 0.3]),
                        min_p=torch.tensor([0.0, 0.05, 0.0, 0.01, 0.2, 0.0])),
    "numbers": dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02),
    "greedy": dict(temperature=0.0),
}


def logits_cases(rank, layout, vocab, padded_to, group=None):
    import specops
    import specops.distributed as sd

    start, end = shard_of(layout, rank)
    draft, ids, target, draft_pad, target_pad = logits_inputs(6, 2, vocab, 3, padded_to)
    draft_probs = torch.softmax(draft, -1)
    draft_probs_pad = torch.nn.functional.pad(draft_probs, (0, padded_to - vocab))
    # (draft_probs, draft_logits) of the single-device call and of this rank's shard.
    sources = {"draft_logits": ((None, draft), (None, draft_pad[..., start:end])),
               "draft_probs": ((draft_probs, None), (draft_probs_pad[..., start:end], None)),
               "greedy drafts": ((None, None), (None, None))}
    # Every source and parameter set with token verification; block verification shares the
    # processed rows, so two of its combinations suffice.
    combinations = [("token", source, name) for source in sources for name in PARAMETER_SETS]
    combinations += [("block", "draft_logits", "all tensors"),
                     ("block", "greedy drafts", "numbers")]
    results = {}
    for verification, source, name in combinations:
        (single_probs, single_logits), (shard_probs, shard_logits) = sources[source]
        parameters = PARAMETER_SETS[name]
        single = specops.chain_speculative_sampling_from_logits(
            single_probs, ids, target, draft_logits=single_logits, seed=21,
            verification=verification, **parameters)
        ours = sd.chain_speculative_sampling_from_logits(
            shard_probs, ids, target_pad[..., start:end], draft_logits=shard_logits, seed=21,
            verification=verification, vocab_start=start, vocab_size=vocab, group=group,
            **parameters)
        results[f"logits {verification} {source} {name}"] = (ours, single)
    results.update(sampling_step_cases(start, end, draft, ids, target, draft_pad, target_pad,
                                       vocab, padded_to, group))
    return results


def sampling_step_cases(start, end, draft, ids, target, draft_pad, target_pad, vocab, padded_to,
                        group):
    """The whole sampling step on shards: the grammar mask (the whole vocabulary's), a bias,
    counts and a prompt mask (this rank's columns), the penalties counting the drafts, the
    draft's own parameters, transformers' order; token and block verification."""
    import specops
    import specops.distributed as sd
    from specops.core.logits.rule import packed_bitmask

    g = torch.Generator().manual_seed(5)
    batch, positions = target.shape[:2]
    bias = torch.randn(batch, vocab, generator=g)
    allowed = torch.rand(batch, positions, vocab, generator=g) < 0.7
    allowed[..., 5] = True
    counts = torch.randint(0, 3, (batch, vocab), generator=g) * (
        torch.rand(batch, vocab, generator=g) < 0.05)
    prompt = torch.rand(batch, vocab, generator=g) < 0.05
    common = dict(temperature=torch.tensor([0.9, 0.0, 1.2, 0.7, 1.0, 0.8]), top_k=50,
                  min_p=0.02, draft_temperature=0.7, draft_top_k=torch.tensor([20]),
                  repetition_penalty=1.3, frequency_penalty=0.2,
                  presence_penalty=torch.tensor([0.0, 0.5, 0.2, 0.1, 0.0, 0.3]),
                  processing_order="transformers", allowed_token_bitmask=packed_bitmask(allowed),
                  seed=torch.arange(batch))

    def columns(t, value):  # this rank's columns of a (B, V) tensor, padded as the logits are
        return torch.nn.functional.pad(t, (0, padded_to - vocab), value=value)[..., start:end]

    results = {}
    for verification in ("token", "block"):
        single = specops.chain_speculative_sampling_from_logits(
            None, ids, target, draft_logits=draft, logit_bias=bias, output_token_counts=counts,
            prompt_token_mask=prompt, verification=verification, **common)
        ours = sd.chain_speculative_sampling_from_logits(
            None, ids, target_pad[..., start:end], draft_logits=draft_pad[..., start:end],
            logit_bias=columns(bias, 0.0), output_token_counts=columns(counts, 0),
            prompt_token_mask=columns(prompt, False), verification=verification,
            vocab_start=start, vocab_size=vocab, group=group, **common)
        results[f"logits {verification} the whole sampling step"] = (ours, single)
    return results


def lossy_cases(rank, layout, vocab, padded_to):
    """Typical acceptance (with the sampling step) and a synthetic rate on shards, against the
    single-device call's tokens and counters."""
    import specops
    import specops.distributed as sd

    start, end = shard_of(layout, rank)
    _, ids, target, _, target_pad = logits_inputs(6, 3, vocab, 10, padded_to)
    ids[:, :2] = target[:, :2].argmax(dim=-1)  # kept by typical acceptance, mostly
    bias = torch.randn(6, vocab, generator=torch.Generator().manual_seed(11))
    common = dict(temperature=torch.tensor([0.9, 0.0, 1.2, 0.7, 1.0, 0.8]), top_k=40,
                  seed=torch.arange(6), offset=2)
    results = {}
    for name, lossy in (("typical", dict(acceptance="typical", posterior_threshold=1.0,
                                         posterior_alpha=3.0)),
                        ("rate", dict(acceptance_rate=0.6))):
        single = specops.chain_speculative_sampling_from_logits(None, ids, target,
                                                                logit_bias=bias, **common,
                                                                **lossy)
        ours = sd.chain_speculative_sampling_from_logits(
            None, ids, target_pad[..., start:end],
            logit_bias=torch.nn.functional.pad(bias, (0, padded_to - vocab))[..., start:end],
            vocab_start=start, vocab_size=vocab, **common, **lossy)
        results[f"lossy {name}"] = (ours, single)
    return results


def logprobs_cases(rank, layout, vocab, padded_to):
    """Logprobs and the top tokens on shards, processed (the whole sampling step, top-k and top-p)
    and raw, against the single-device call's."""
    import specops
    import specops.distributed as sd

    start, end = shard_of(layout, rank)
    draft, ids, target, draft_pad, target_pad = logits_inputs(6, 2, vocab, 4, padded_to)
    ids[:, 0] = target[:, 0].argmax(dim=-1)  # accepted often: later positions have tokens
    bias = torch.randn(6, vocab, generator=torch.Generator().manual_seed(6))
    common = dict(temperature=torch.tensor([0.9, 0.0, 1.2, 0.7, 1.0, 0.8]), top_k=40, top_p=0.9,
                  repetition_penalty=1.2, output_token_counts=torch.zeros(6, vocab).long(),
                  seed=torch.arange(6), num_top_logprobs=5)
    results = {}
    for mode in ("processed", "raw"):
        single = specops.chain_speculative_sampling_from_logits(
            None, ids, target, draft_logits=draft, logit_bias=bias, logprobs=mode, **common)
        shard = dict(common, output_token_counts=torch.nn.functional.pad(
            common["output_token_counts"], (0, padded_to - vocab))[..., start:end])
        ours = sd.chain_speculative_sampling_from_logits(
            None, ids, target_pad[..., start:end], draft_logits=draft_pad[..., start:end],
            logit_bias=torch.nn.functional.pad(bias, (0, padded_to - vocab))[..., start:end],
            logprobs=mode, vocab_start=start, vocab_size=vocab, **shard)
        results[mode] = (ours, single)
    # T = +inf: every kept token's logprob is equal; the top tokens are still the largest logits,
    # whichever rank holds them.
    flat = dict(temperature=float("inf"), seed=torch.arange(6), num_top_logprobs=5,
                logprobs="processed")
    single = specops.chain_speculative_sampling_from_logits(None, ids, target,
                                                            draft_logits=draft, **flat)
    ours = sd.chain_speculative_sampling_from_logits(
        None, ids, target_pad[..., start:end], draft_logits=draft_pad[..., start:end],
        vocab_start=start, vocab_size=vocab, **flat)
    results["processed, T = +inf"] = (ours, single)
    # Greedy rows whose largest logit two tokens of one shard share: one top token, the first.
    tied = target.clone()
    tied[..., 1:3] = target.amax(dim=-1, keepdim=True) + 1
    tied_pad = torch.nn.functional.pad(tied, (0, padded_to - vocab), value=0.0)
    greedy = dict(temperature=0.0, seed=torch.arange(6), num_top_logprobs=5, logprobs="processed")
    at_peak = ids.clone()
    at_peak[:, 0] = 1  # the argmax: accepted
    single = specops.chain_speculative_sampling_from_logits(None, at_peak, tied, **greedy)
    ours = sd.chain_speculative_sampling_from_logits(
        None, at_peak, tied_pad[..., start:end], vocab_start=start, vocab_size=vocab, **greedy)
    results["processed, greedy, tied peak"] = (ours, single)
    return results


def collective_records(rank, world):
    """The collectives of each kind of call, at two vocabularies: name -> [log at V1, log at V2]."""
    import specops.distributed as sd

    records = {}
    for vocab in (1024 * world + 300, 4096 * world + 7):
        width = -(-vocab // world)
        start, end = rank * width, (rank + 1) * width
        draft, ids, target, draft_pad, target_pad = chain_inputs(4, 3, vocab, 1, width * world)
        ldraft, _, ltarget, ldraft_pad, ltarget_pad = logits_inputs(4, 3, vocab, 1, width * world)
        calls = {
            "token": lambda: sd.chain_speculative_sampling(
                draft_pad[..., start:end], ids, target_pad[..., start:end], seed=1,
                vocab_start=start, vocab_size=vocab),
            "block": lambda: sd.chain_speculative_sampling(
                draft_pad[..., start:end], ids, target_pad[..., start:end], seed=1,
                verification="block", vocab_start=start, vocab_size=vocab),
            "token seed=None": lambda: sd.chain_speculative_sampling(
                None, ids, target_pad[..., start:end], vocab_start=start, vocab_size=vocab),
            "logits plain": lambda: sd.chain_speculative_sampling_from_logits(
                None, ids, ltarget_pad[..., start:end], draft_logits=ldraft_pad[..., start:end],
                seed=1, vocab_start=start, vocab_size=vocab),
            "logits top-k": lambda: sd.chain_speculative_sampling_from_logits(
                None, ids, ltarget_pad[..., start:end], seed=1, top_k=5, vocab_start=start,
                vocab_size=vocab),
            "logits all block": lambda: sd.chain_speculative_sampling_from_logits(
                None, ids, ltarget_pad[..., start:end], draft_logits=ldraft_pad[..., start:end],
                seed=1, top_k=5, top_p=0.8, min_p=0.01, temperature=0.7, verification="block",
                vocab_start=start, vocab_size=vocab),
        }
        for name, call in calls.items():
            with recorded([]) as log:
                call()
            records.setdefault(name, []).append(log)
    return records


def bad_inputs(rank, world):
    """Each bad layout: (exception type, message) on this rank, or None if it did not raise."""
    import specops.distributed as sd

    vocab = 3000
    draft, ids, target, _, _ = chain_inputs(4, 3, vocab, 2)
    cases = {
        "gap": [(0, 1000), (1100, 3000)],
        "overlap": [(0, 1100), (1000, 3000)],
        "start outside": [(0, 1500), (3000, 4500)],
        "short of vocab_size": [(0, 1000), (1000, 2900)],
    }
    outcomes = {}

    def attempt(name, call):
        begin = time.monotonic()
        try:
            call()
            outcomes[name] = None
        except (ValueError, TypeError) as err:
            outcomes[name] = (type(err).__name__, str(err))
        seconds[name] = time.monotonic() - begin

    seconds = {}

    for name, layout in cases.items():
        start, end = layout[rank]
        shard = torch.nn.functional.pad(target, (0, 4500 - vocab))[..., start:end]
        attempt(name, lambda: sd.chain_speculative_sampling(None, ids, shard, seed=0,
                                                            vocab_start=start, vocab_size=vocab))
    start, end = (0, 1500) if rank == 0 else (1500, 3000)
    batch = 4 if rank == 0 else 3
    attempt("batch", lambda: sd.chain_speculative_sampling(
        None, ids[:batch], target[:batch, :, start:end], seed=0, vocab_start=start))
    num = 3 if rank == 0 else 2
    attempt("num_draft", lambda: sd.chain_speculative_sampling(
        None, ids[:, :num], target[:, : num + 1, start:end], seed=0, vocab_start=start))
    wrong = ids.float() if rank == 1 else ids  # refused by rank 1's own checks
    attempt("local", lambda: sd.chain_speculative_sampling(
        None, wrong, target[..., start:end], seed=0, vocab_start=start))
    attempt("vocab_size", lambda: sd.chain_speculative_sampling(
        None, ids, target[..., start:end], seed=0, vocab_start=start,
        vocab_size=3000 + rank))
    attempt("negative vocab_start", lambda: sd.chain_speculative_sampling(
        None, ids, target[..., start:end], seed=0, vocab_start=-rank))
    # Too large for the layout record: refused like any other value, not by an overflow that
    # would leave the other rank waiting in the exchange.
    attempt("huge vocab_start", lambda: sd.chain_speculative_sampling(
        None, ids, target[..., start:end], seed=0, vocab_start=start + rank * 2**63))
    # seed=None: the seed broadcast carries the offsets, so their number must agree.
    attempt("offsets", lambda: sd.chain_speculative_sampling(
        None, ids, target[..., start:end], offset=torch.zeros(1 + 3 * rank, dtype=torch.int64),
        vocab_start=start))
    # After every refusal the group still works: no rank is left inside a collective.
    attempt("good", lambda: sd.chain_speculative_sampling(
        None, ids, target[..., start:end], seed=0, vocab_start=start))
    # SPECOPS_VALIDATE=1: a NaN in one rank's shard is named on every rank, an id past
    # vocab_size too; what a padded shard holds past vocab_size is never read.
    padded = torch.nn.functional.pad(target, (0, 100), value=float("nan"))
    dirty = padded.clone()
    if rank == 1:
        dirty[2, 1, 2000] = float("nan")
    legal = ids.clone()
    legal[1, 0] = 7  # chain_inputs' id past vocab_size, which validation refuses
    too_large = legal.clone()
    too_large[0, 0] = vocab + 50
    with validating():
        attempt("validate nan", lambda: sd.chain_speculative_sampling(
            None, legal, dirty[..., start:end], seed=0, vocab_start=start))
        attempt("validate id", lambda: sd.chain_speculative_sampling(
            None, too_large, target[..., start:end], seed=0, vocab_start=start))
        attempt("validate int32 ids", lambda: sd.chain_speculative_sampling(
            None, legal.int(), target[..., start:end], seed=0, vocab_start=start))
        attempt("validate padding", lambda: sd.chain_speculative_sampling(
            None, legal, padded[..., start:end + (100 if rank == 1 else 0)], seed=0,
            vocab_start=start, vocab_size=vocab))
        # A row whose mass on rank 1's columns is tripled: neither shard shows it alone.
        heavy = target.clone()
        if rank == 1:
            heavy[1, 0, start:end] *= 3
        attempt("validate mass", lambda: sd.chain_speculative_sampling(
            None, legal, heavy[..., start:end], seed=0, vocab_start=start))
    attempt("empty batch, logprobs", lambda: sd.chain_speculative_sampling_from_logits(
        None, ids[:0], target[:0, :, start:end], draft_logits=draft[:0, :, start:end],
        draft_top_k=5, logprobs="processed", num_top_logprobs=2, acceptance="typical", seed=0,
        vocab_start=start))
    # The same target parameters in two forms, with the draft's own top-k: the same searches.
    attempt("top_k in two forms, draft_top_k", lambda: sd.chain_speculative_sampling_from_logits(
        None, ids, target[..., start:end].log(), draft_logits=draft[..., start:end].log(),
        top_k=0 if rank == 0 else torch.tensor([0]), draft_top_k=5, logprobs="processed",
        acceptance="typical", seed=0, vocab_start=start))
    attempt("empty batch", lambda: sd.chain_speculative_sampling_from_logits(
        None, ids[:0], target[:0, :, start:end], top_k=torch.tensor([3]), top_p=0.5, seed=0,
        verification="block", vocab_start=start))
    other_values(rank, attempt, draft[..., start:end], ids, target[..., start:end], start)
    return outcomes, seconds


def other_values(rank, attempt, draft, ids, target, start):
    """Rank 1 passing another seed, offset or draft ids than rank 0, on every path (token and
    block verification, from probabilities and from logits), and the same values in other forms."""
    import specops.distributed as sd

    def probs(draft_ids, verification="token", one_hot=False, **seeding):
        return lambda: sd.chain_speculative_sampling(
            None if one_hot else draft, draft_ids, target, verification=verification,
            vocab_start=start, **seeding)

    def logits(draft_ids, verification="token", **seeding):
        return lambda: sd.chain_speculative_sampling_from_logits(
            None, draft_ids, target.log(), draft_logits=draft.log(), top_k=50,
            verification=verification, vocab_start=start, **seeding)

    seeds = torch.arange(4, dtype=torch.int64) + 40
    other_seeds = seeds.clone()
    other_seeds[3] += rank
    changed = ids.clone()
    changed[3, 0] += rank
    base = ids.clone()
    base[2] = torch.tensor([10, 20, 30])
    swapped, bumped = base.clone(), base.clone()
    if rank == 1:  # the same plain sum; +1 / -2 / +1 also the same position-weighted sum
        swapped[2] = torch.tensor([20, 10, 30])
        bumped[2] = torch.tensor([11, 18, 31])
    attempt("other seed", probs(ids, seed=5 + rank))
    attempt("other per-request seeds, block", probs(ids, "block", seed=other_seeds))
    attempt("other offset, one-hot drafts", probs(ids, one_hot=True, seed=0, offset=rank))
    attempt("other offset, seed=None", probs(ids, offset=rank))
    attempt("other seed, logits", logits(ids, seed=5 + rank))
    attempt("other per-request offsets, logits block",
            logits(ids, "block", seed=seeds, offset=other_seeds))
    attempt("other ids", probs(changed, seed=0))
    attempt("swapped ids, block", probs(swapped, "block", seed=0))
    attempt("+1 -2 +1 ids, logits", logits(bumped, seed=0))
    attempt("other ids, logits block", logits(changed, "block", seed=0))
    # Equal values: int32 on one rank, int64 on the other; offset=None is 0 with a given seed.
    as_given = (lambda t: t.int()) if rank == 1 else (lambda t: t)
    attempt("same values", probs(as_given(ids), "block", seed=as_given(seeds),
                                 offset=as_given(seeds)))
    attempt("same values, logits", logits(as_given(ids), seed=as_given(seeds), offset=3))
    attempt("offset None and 0", probs(ids, seed=1, offset=0 if rank == 1 else None))
    attempt("other temperature, logits", lambda: sd.chain_speculative_sampling_from_logits(
        None, ids, target.log(), temperature=0.7 + 0.1 * rank, seed=0, vocab_start=start))
    per_request_p = torch.tensor([0.9, 0.8, 0.95, 0.7 + 0.1 * rank])
    attempt("other per-request top_p, logits block",
            lambda: sd.chain_speculative_sampling_from_logits(
                None, ids, target.log(), top_p=per_request_p, seed=0, verification="block",
                vocab_start=start))
    attempt("other draft_temperature, logits", lambda: sd.chain_speculative_sampling_from_logits(
        None, ids, target.log(), draft_logits=draft.log(), draft_temperature=0.7 + 0.1 * rank,
        seed=0, vocab_start=start))
    counts = torch.zeros(ids.shape[0], target.shape[-1], dtype=torch.int64)
    attempt("other repetition_penalty, logits",
            lambda: sd.chain_speculative_sampling_from_logits(
                None, ids, target.log(), repetition_penalty=1.2 + 0.1 * rank,
                output_token_counts=counts, seed=0, vocab_start=start))
    mask = torch.full((*target.shape[:2], (3000 + 31) // 32), -1, dtype=torch.int32)  # V = 3000
    mask[0, 0, 0] -= rank  # token 0 banned on rank 1 only
    attempt("other allowed_token_bitmask, logits",
            lambda: sd.chain_speculative_sampling_from_logits(
                None, ids, target.log(), allowed_token_bitmask=mask, seed=0, vocab_start=start))
    parameters = (dict(temperature=0.7, top_k=5) if rank == 0 else
                  dict(temperature=torch.tensor([0.7], dtype=torch.float64),
                       top_k=torch.tensor([5], dtype=torch.int32)))
    attempt("same parameters in other forms, logits",
            lambda: sd.chain_speculative_sampling_from_logits(
                None, ids, target.log(), seed=0, vocab_start=start, **parameters))


@contextlib.contextmanager
def validating():
    import os

    os.environ["SPECOPS_VALIDATE"] = "1"
    try:
        yield
    finally:
        del os.environ["SPECOPS_VALIDATE"]


def two_ranks(rank, world):
    """Chunk-aligned unequal shards, the last padded (V = 3000 in [0, 2048) + [2048, 3072)):
    every case against the single-device call; the collectives; bad input."""
    layout = [(0, 2048), (2048, 3072)]
    results = probabilities_cases(rank, layout, 3000, 3072)
    results.update(probabilities_cases(rank, [(0, 2048), (2048, 4096)], 4096, 4096,
                                       prefix="equal shards "))
    results.update(logits_cases(rank, layout, 3000, 3072))
    results.update(lossy_cases(rank, layout, 3000, 3072))
    return {"exact": results, "collectives": collective_records(rank, world),
            "bad": bad_inputs(rank, world), "processed": processed_rows(rank, layout, 3000),
            "logprobs": logprobs_cases(rank, layout, 3000, 3072)}


def first_tokens(rank, layout, vocab, verification, calls=4, batch=5000):
    """Counts of out[:, 0] and of out[:, 1] where emitted, over calls * batch requests whose rows
    are the same: their distributions are p_0 and (token verification) p_1."""
    import specops.distributed as sd

    support = torch.tensor([5, 690, 699, 700, 701, 1020, 1030, 1490, 1499, 1500, 1501, 1999])
    g = torch.Generator().manual_seed(4)
    p = torch.zeros(2, vocab)
    p[:, support] = torch.rand(2, len(support), generator=g) + 0.2
    p /= p.sum(-1, keepdim=True)
    q = torch.zeros(1, vocab)
    q[:, support[::2]] = torch.rand(1, len(support[::2]), generator=g) + 0.2
    q /= q.sum(-1, keepdim=True)
    start, end = shard_of(layout, rank)
    first = torch.zeros(vocab, dtype=torch.int64)
    second = torch.zeros(vocab, dtype=torch.int64)
    for call in range(calls):
        ids = torch.multinomial(q, batch, replacement=True, generator=g).T.contiguous()
        out, _, emitted = sd.chain_speculative_sampling(
            q.expand(batch, 1, vocab)[..., start:end], ids,
            p.expand(batch, 2, vocab)[..., start:end], seed=100 + call,
            verification=verification, vocab_start=start, vocab_size=vocab)
        first += torch.bincount(out[:, 0].long(), minlength=vocab)
        second += torch.bincount(out[emitted == 1, 1].long(), minlength=vocab)
    return p, first, second


def processed_rows(rank, layout, vocab):
    """This rank's columns of the target's and the draft's processed rows (every parameter, as
    tensors), and the single-device rows: the same bit for bit on chunk-aligned shards; on
    shards that cut chunks the same tokens kept, the weights within a rounding."""
    from specops.chain.processed import processed_inputs
    from specops.core.logits.rule import Step, packed_bitmask
    from specops.distributed import logits

    start, end = layout[rank]
    end = min(end, vocab)  # a padded last shard: its real columns
    draft, _, target, _, _ = logits_inputs(6, 2, vocab, 8, vocab)
    parameters = PARAMETER_SETS["all tensors"]
    values = [parameters[name] for name in ("temperature", "top_k", "top_p", "min_p")]
    shard = logits.Shard(start, end - start, vocab, dist.group.WORLD)
    searches = logits.SEARCH_TOP_K | logits.SEARCH_TOP_P
    ours = logits.processed_inputs(shard, None, target[..., start:end], draft[..., start:end],
                                   *values, searches)
    # The draft's parameters: the target's; no draft ids are read without penalties.
    single = processed_inputs(None, None, target, draft, values, (None,) * 4)
    # The whole sampling step: a mask, a bias, penalties counting drafts of both shards (one
    # repeated), the draft's own parameters, transformers' order.
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, vocab, (6, 2), generator=g)
    ids[:, 1] = torch.where(torch.arange(6) % 2 == 0, ids[:, 0], vocab - 1 - ids[:, 0])
    target = target.clone()  # the drafts among the largest logits of every row: kept, penalised
    for column in (0, 1):
        target.scatter_(2, ids[:, None, column].expand(6, 3)[..., None],
                        target.amax(dim=-1, keepdim=True) + 0.5)
    counts = torch.randint(0, 3, (6, vocab), generator=g) * (torch.rand(6, vocab, generator=g) < 0.1)
    step = Step(logit_bias=torch.randn(6, vocab, generator=g),
                allowed_token_bitmask=packed_bitmask(torch.rand(6, 3, vocab, generator=g) < 0.7),
                repetition_penalty=torch.tensor([1.5]), frequency_penalty=torch.tensor([0.3]),
                presence_penalty=torch.full((6,), 0.4), output_token_counts=counts,
                prompt_token_mask=torch.rand(6, vocab, generator=g) < 0.1)
    cut = step._replace(**{name: getattr(step, name)[..., start:end]
                           for name in ("logit_bias", "output_token_counts", "prompt_token_mask")})
    draft_own = (torch.tensor([0.6]), torch.tensor([30]), None, None)
    ours += logits.processed_inputs(shard, None, target[..., start:end], draft[..., start:end],
                                    *values, searches, draft_own, cut, ids, True)
    single += processed_inputs(None, ids, target, draft, values, draft_own, step=step,
                               min_p_last=True)
    return ours, tuple(t[..., start:end] for t in single)


def three_ranks(rank, world):
    """Chunk-aligned shards in another rank order, a subgroup, seed=None, and the distribution of
    tokens with shard boundaries inside chunks."""
    import specops.distributed as sd

    permuted = [(2048, 4096), (0, 1024), (1024, 2048)]  # the last padded: V = 4000
    results = probabilities_cases(rank, permuted, 4000, 4096)
    subgroup = dist.new_group([0, 2])
    if rank != 1:
        halves = [(0, 1024), None, (1024, 2048)]
        results.update(probabilities_cases(rank, halves, 1500, 2048, group=subgroup,
                                           prefix="subgroup "))
    # Boundaries inside chunks decide the pieces; more ranks with the same ones change nothing.
    draft, ids, target, _, _ = chain_inputs(6, 3, 2000, 6)
    three_way = [(0, 700), (700, 1024), (1024, 2000)]
    two_way = [(0, 700), None, (700, 2000)]
    for verification in ("token", "block"):
        start, end = three_way[rank]
        on_three = sd.chain_speculative_sampling(draft[..., start:end], ids, target[..., start:end],
                                                 seed=8, verification=verification,
                                                 vocab_start=start)
        if rank != 1:
            start, end = two_way[rank]
            on_two = sd.chain_speculative_sampling(
                draft[..., start:end], ids, target[..., start:end], seed=8,
                verification=verification, vocab_start=start, group=subgroup)
            results[f"3 ranks against 2, {verification}"] = (on_three, on_two)
    # seed=None: one draw for the group, the same tokens on every rank.
    draft, ids, target, _, _ = chain_inputs(6, 3, 3000, 5)
    unaligned = [(0, 700), (700, 1500), (1500, 3000)]
    start, end = unaligned[rank]
    torch.manual_seed(rank)  # different generators: only the first rank's draw may count
    drawn = sd.chain_speculative_sampling(draft[..., start:end], ids, target[..., start:end],
                                          vocab_start=start)
    processed = processed_rows(rank, unaligned, 3000)
    statistics = {mode: first_tokens(rank, [(0, 700), (700, 1500), (1500, 2000)], 2000, mode)
                  for mode in ("token", "block")}
    return {"exact": results, "drawn": drawn, "statistics": statistics, "processed": processed}


def nccl_graph(rank, world):
    """A call captured in a CUDA graph with its NCCL collectives: replays give the eager tokens,
    and follow seeds and offsets updated in place."""
    import specops.distributed as sd
    from graphs import capture, warm_up  # tests/graphs.py

    width, device = 2048, torch.device("cuda", rank)
    vocab = width * world - 100  # the last shard padded
    draft, ids, target, draft_pad, target_pad = chain_inputs(8, 3, vocab, 9, width * world)
    start = rank * width
    draft_shard = draft_pad[..., start:start + width].to(device)
    target_shard = target_pad[..., start:start + width].to(device)
    ids = ids.to(device)
    seeds = torch.arange(8, dtype=torch.int64, device=device) + 40
    offsets = torch.zeros(8, dtype=torch.int64, device=device)
    outcomes = {}
    for verification in ("token", "block"):
        accepted = torch.zeros(8, dtype=torch.int64, device=device)
        emitted = torch.zeros(8, dtype=torch.int64, device=device)

        def step():
            return sd.chain_speculative_sampling(
                draft_shard, ids, target_shard, accepted, emitted, seed=seeds, offset=offsets,
                verification=verification, vocab_start=start, vocab_size=vocab)[0]

        (eager,) = warm_up(lambda: step().clone())  # checks the layout, which capture cannot
        graph, captured = capture(step)
        graph.replay()
        same = torch.equal(captured, eager)
        offsets += 1
        graph.replay()
        replayed = captured.clone()
        moved = torch.equal(replayed, step())
        offsets.zero_()
        outcomes[verification] = (same, moved)
    return outcomes


def run_all(world):
    """For a manual run: python tests/distributed_cases.py."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        return spawn(world, {2: "two_ranks", 3: "three_ranks"}[world], Path(tmp))


if __name__ == "__main__":
    import sys
    print(run_all(int(sys.argv[1]) if len(sys.argv) > 1 else 2)[0].keys())
