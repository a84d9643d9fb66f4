"""``specops.warmup``: compile and load, before a decode loop starts, every kernel it can launch
(token, block and tree verification alike)."""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterable, Union

import torch

Choices = Union[bool, Iterable[bool]]


def _choices(value, scalar_types) -> tuple:
    """One value or several (a string is one value)."""
    if isinstance(value, (scalar_types, str)) or not hasattr(value, "__iter__"):
        return (value,)
    return tuple(value)


def warmup(
    device: Union[str, torch.device],
    vocab: int,
    num_draft: Union[int, Iterable[int]],
    dtype: Union[torch.dtype, Iterable[torch.dtype]] = torch.bfloat16,
    *,
    draft_probs: Choices = True,
    ids_dtype: Union[torch.dtype, Iterable[torch.dtype]] = torch.int64,
    counter_dtype: Union[torch.dtype, Iterable[torch.dtype]] = torch.int32,
    verification: Union[str, Iterable[str]] = "token",
    logits: Choices = False,
    parents_dtype: Union[torch.dtype, Iterable[torch.dtype]] = torch.int64,
    flattened: Choices = False,
    logit_bias: Choices = False,
    allowed_token_bitmask: Choices = False,
    penalties: Choices = False,
    prompt_token_mask: Choices = False,
) -> int:
    """Compile and load every Triton kernel that ``chain_speculative_sampling`` (and, with
    ``verification="tree"``, ``tree_speculative_sampling``) can launch on ``device`` for these
    settings, so that no call after this one compiles or loads anything.

    A decode loop's calls differ in batch size, seed form (None, an int, a tensor of 1 or B
    seeds), offset form and strides; none of these selects a different kernel (they are runtime
    arguments, and both the single-program and the split launch are loaded together).  What does
    select one: the probability ``dtype``, ``draft_probs`` given (True) or None (False), the draft
    length through next_pow2(N + 1) (pass every ``num_draft`` the loop uses, e.g. ``range(1, 8)``),
    the id and counter dtypes (from logits, the counter dtype does not apply: those ops count
    in int32 counters of their own), and whether V and the rows are 16-byte aligned (so pass the
    model's real ``vocab``; contiguous rows are aligned when V % 16 == 0), and ``verification``
    ("token", "block", "tree", "traversal" for
    ``tree_speculative_sampling(..., verification="traversal")``, or several), and ``logits``: True for ``chain_speculative_sampling_from_logits``
    (``dtype`` then the logits' dtype; drafts from ``draft_logits`` or, with ``draft_probs``, from
    draft probabilities of that dtype; the parameters as Python numbers or tensors of the dtypes
    numbers become, float32 and int64: a tensor of another dtype loads its kernel on first use;
    logprobs and typical acceptance's entropy pass are loaded with them, and lossy acceptance
    draws its last token through the chain of no drafts, or the tree of one node: include 0 in
    ``num_draft``, and 1 for "tree"), False for ``chain_speculative_sampling``. From logits, the
    parts of step 0 a call turns on select the chain kernels too (they apply them as they read
    the rows): ``logit_bias`` (float32), ``allowed_token_bitmask``, ``penalties`` (any of the
    three, with int32 output_token_counts) and ``prompt_token_mask`` (with penalties only) each
    True where the loop's calls give it, False where not, or (False, True) for both; they select
    a tree's statistics and tree kernels alike, and the statistics logprobs and lossy acceptance
    read.  For "tree" and "traversal",
    ``num_draft`` is the number of nodes M (the kernel is selected by next_pow2(M + 1)),
    ``ids_dtype`` and ``parents_dtype`` the dtypes of the node tokens and parents, ``logits`` True
    for ``tree_speculative_sampling_from_logits``, and ``counter_dtype`` does not apply
    (``with_replacement`` selects no kernel). ``flattened``: True for ``specops.varlen``'s
    functions (a flattened batch's kernels; its ``cu_num_draft_tokens`` of ``ids_dtype``,
    ``num_draft`` the max_num_draft_tokens), False for the padded ones (token and block only).
    ``num_draft`` 0 (a step without drafts) is a chain length of its own; trees skip it (a tree
    has nodes).  Each argument may be one value or several; every
    combination is loaded.  Returns the number of combinations.

    On a CUDA device with the Triton backend; elsewhere it does nothing and returns 0.
    """
    from .chain.arguments import INDEX_DTYPES, PROB_DTYPES
    from .core.ops.backends import selected_backend

    vocab = _count("vocab", vocab)
    num_drafts = sorted({_count("num_draft", n, least=0) for n in _choices(num_draft, int)})
    dtypes = _members("dtype", _choices(dtype, torch.dtype), PROB_DTYPES)
    has_drafts = _members("draft_probs", _choices(draft_probs, bool), (True, False))
    ids_dtypes = _members("ids_dtype", _choices(ids_dtype, torch.dtype), INDEX_DTYPES)
    counter_dtypes = _members("counter_dtype", _choices(counter_dtype, torch.dtype), INDEX_DTYPES)
    modes = _members("verification", _choices(verification, str),
                     ("token", "block", "tree", "traversal"))
    from_logits = _members("logits", _choices(logits, bool), (False, True))
    parents_dtypes = _members("parents_dtype", _choices(parents_dtype, torch.dtype), INDEX_DTYPES)
    layouts = _members("flattened", _choices(flattened, bool), (False, True))
    parts = [_members(name, _choices(value, bool), (True, False)) for name, value in (
        ("logit_bias", logit_bias), ("allowed_token_bitmask", allowed_token_bitmask),
        ("penalties", penalties), ("prompt_token_mask", prompt_token_mask))]
    # A prompt mask without penalties changes nothing: the same kernels as without it.
    steps = sorted({(bias, mask, penalty, prompt and penalty)
                    for bias, mask, penalty, prompt in itertools.product(*parts)})
    device = torch.device(device)
    if selected_backend(device) != "triton":
        return 0
    from .chain.block import launch as block
    from .chain.rows import Flattened
    from .chain.token import launch as token
    from .tree.launch import (tree_speculative_sampling_from_logits_triton,
                              tree_speculative_sampling_triton)

    launchers = {("token", False): token.chain_speculative_sampling_triton,
                 ("block", False): block.block_speculative_sampling_triton,
                 ("token", True): token.chain_speculative_sampling_from_logits_triton,
                 ("block", True): block.block_speculative_sampling_from_logits_triton}
    # From logits, drafts come from draft probabilities, from draft logits, or neither.
    sources = {(True, False): ("probs",), (False, False): (None,),
               (True, True): ("probs", "logits"), (False, True): (None,)}
    # The parameters as the public function makes Python numbers into tensors.
    parameters = [torch.ones(1, dtype=torch.float32, device=device),
                  torch.zeros(1, dtype=torch.int64, device=device),
                  torch.ones(1, dtype=torch.float32, device=device),
                  torch.zeros(1, dtype=torch.float32, device=device)]
    # The launchers load their kernels on the current device, as a call's backend makes the
    # tensors' device current for it.
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        count = 0
        chains = [mode for mode in modes if mode in ("token", "block")]
        for mode, logit, dt, n, has_draft, ids_dt, counter_dt, flat, step in itertools.product(
                chains, from_logits, dtypes, num_drafts, has_drafts, ids_dtypes, counter_dtypes,
                layouts, steps):
            if step != steps[0] and not logit:  # step 0 is verification from logits' only
                continue
            if logit:  # the ops from logits count in int32 counters of their own
                if counter_dt != counter_dtypes[0]:
                    continue
                counter_dt = torch.int32
            for source in sources[has_draft, logit]:
                target = torch.zeros(1, n + 1, vocab, dtype=dt, device=device)
                draft = torch.zeros(1, n, vocab, dtype=dt, device=device) if source else None
                ids = torch.zeros(1, n, dtype=ids_dt, device=device)
                layout = {}
                if flat:  # one request of n drafts, its rows stacked
                    target, ids = target[0], ids[0]
                    draft = None if draft is None else draft[0]
                    cu = torch.tensor([0, n], dtype=ids_dt, device=device)
                    layout = {"flattened": Flattened(cu, n)}
                counters = torch.zeros(2, dtype=counter_dt, device=device)
                seed = torch.zeros(2, dtype=torch.int64, device=device)
                args = [draft, ids, target, counters[:1], counters[1:], seed[:1], seed[1:]]
                if logit:  # (draft_probs, ids, target_logits, draft_logits, counters, seed, offset)
                    args[:3] = [draft if source == "probs" else None, ids, target]
                    args.insert(3, draft if source == "logits" else None)
                    args += (parameters + [None] * 4  # the draft's
                             + list(_step(device, vocab, n, flat, *step)) + [None])
                # Split over two programs too where V has two chunks (block: its scan kernel).
                for programs in (1, 2):
                    launchers[mode, logit](*args, programs, **layout)
                count += 1
        if True in from_logits:  # typical acceptance: the statistics with each row's entropy
            count += _entropy_passes(device, vocab, dtypes, num_drafts, ids_dtypes, layouts,
                                     steps, modes, parameters)
        # Trees: no counters; parents of their own dtype; at least one node. Target-only,
        # traversal verification launches the token rule's kernel.
        trees = [mode for mode in modes if mode in ("tree", "traversal")]
        for mode, logit, dt, n, has_draft, ids_dt, parents_dt, step in itertools.product(
                trees, from_logits, dtypes, [n for n in num_drafts if n], has_drafts, ids_dtypes,
                parents_dtypes, steps):
            if step != steps[0] and not logit:  # step 0 is verification from logits' only
                continue
            rule = "traversal" if mode == "traversal" else "token"
            for source in sources[has_draft, logit]:
                target = torch.zeros(1, n + 1, vocab, dtype=dt, device=device)
                draft = torch.zeros_like(target) if source else None  # a row per node, the root
                ids = torch.zeros(1, n, dtype=ids_dt, device=device)
                parents = torch.zeros(1, n, dtype=parents_dt, device=device)
                seed = torch.zeros(2, dtype=torch.int64, device=device)
                if logit:  # the statistics, then the tree kernel reading the logits
                    tree_speculative_sampling_from_logits_triton(
                        draft if source == "probs" else None, ids, parents, target,
                        draft if source == "logits" else None, seed[:1], seed[1:],
                        *parameters, True, *[None] * 4, *_step(device, vocab, n, False, *step),
                        None, rule)
                else:
                    tree_speculative_sampling_triton(draft, ids, parents, target, seed[:1],
                                                     seed[1:], True, rule)
                count += 1
        return count


def _entropy_passes(device, vocab, dtypes, num_drafts, ids_dtypes, layouts, steps, modes,
                    parameters) -> int:
    """Load the statistics kernel with each row's entropy as lossy acceptance launches it (the
    logprobs op, with rule step 0 as the verifiers apply it): a chain's draft rows, each counting
    the drafts before it (padded or flattened), and a tree's rows, each counting its path."""
    from .core.logprobs.launch import token_logprobs_triton
    from .tree.processed import paths

    count = 0
    trees = any(mode in ("tree", "traversal") for mode in modes)
    for dt, n, ids_dt, flat, step in itertools.product(dtypes, num_drafts, ids_dtypes,
                                                       layouts + ((None,) if trees else ()),
                                                       steps):
        ids = torch.zeros(1, n, dtype=ids_dt, device=device)
        logits = torch.zeros(1, n + 1, vocab, dtype=dt, device=device)
        # Each layout's rows, their tokens and what they count; step 0 for rows + 1 rows.
        if flat is None:  # a tree of n nodes: the root's row and the nodes'
            if n == 0:
                continue
            layout, rows = (paths(ids, torch.zeros_like(ids), vocab), None), n
            tokens = torch.zeros(1, n + 1, n, dtype=ids_dt, device=device)
        elif flat:  # the target's rows, stacked
            logits, rows = logits[0], n
            layout = (ids[0], torch.tensor([0, n], dtype=ids_dt, device=device))
            tokens = torch.zeros(1, n + 1, dtype=ids_dt, device=device)
        else:  # the draft rows
            if n == 0:
                continue
            logits, rows = logits[:, :n], n - 1
            layout, tokens = (ids[:, None, :].expand(1, n, n), None), ids
        token_logprobs_triton(logits, tokens, *parameters, 0, "vllm", True, *layout,
                              *_step(device, vocab, rows, bool(flat), *step))
        count += 1
    return count


def _step(device: torch.device, vocab: int, num_draft: int, flat: bool, bias: bool, mask: bool,
          penalties: bool, prompt: bool):
    """Step 0 (core/logits/rule.Step) of one request of ``num_draft`` drafts with the parts
    that are True, in the dtypes the public functions document."""
    from .core.logits.rule import Step

    def request(dtype):
        return torch.zeros(1, vocab, dtype=dtype, device=device)

    rows = (num_draft + 1,) if flat else (1, num_draft + 1)
    one = torch.ones(1, device=device)
    return Step(request(torch.float32) if bias else None,
                torch.zeros(*rows, -(-vocab // 32), dtype=torch.int32, device=device) if mask
                else None,
                one if penalties else None, None, None,
                request(torch.int32) if penalties else None,
                request(torch.bool) if prompt else None)


def _count(name: str, value, least: int = 1) -> int:
    """An int of at least ``least``, or a clear error naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}; got {value!r}")
    return value


def _members(name: str, values: tuple, allowed: tuple) -> tuple:
    """The values, each one of ``allowed``, or a clear error naming the argument."""
    for value in values:
        if value not in allowed:
            spelled = ", ".join(str(a).replace("torch.", "") for a in allowed)
            raise ValueError(f"{name} must be one of {spelled}; got {value!r}")
    return values
