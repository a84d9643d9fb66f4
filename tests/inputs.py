"""Input builders shared by the tests: kernel-against-reference inputs (interpreter and GPU), and
the small softmax inputs whose values tests/test_op.py's fixed-seed expectations pin; and
``Allocations``, which records the tensors a call makes."""

from __future__ import annotations

import torch

# The kernel's device: a GPU where there is one, else CPU tensors under TRITON_INTERPRET=1.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(batch, num_draft, vocab, *, dtype=torch.float32, draft=True, ids_dtype=torch.int64,
                sharp=4.0, seed=0, device=DEVICE):
    """Peaked random rows, and drafts drawn from draft rows that half follow the target, so that
    they are often accepted: (draft_probs or None, draft_token_ids, target_probs) on ``device``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    target = torch.rand(batch, num_draft + 1, vocab, generator=gen, device=device) ** sharp
    target = target / target.sum(-1, keepdim=True)
    draft_probs = torch.rand(batch, num_draft, vocab, generator=gen, device=device) ** sharp
    draft_probs = 0.5 * draft_probs / draft_probs.sum(-1, keepdim=True) + 0.5 * target[:, :-1]
    ids = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).reshape(batch, num_draft)
    return (draft_probs.to(dtype) if draft else None), ids.to(ids_dtype), target.to(dtype)


def seeds(batch, per_request, offset_per_request=False, base=12345, device=DEVICE):
    """int64 (seed, offset) tensors of 1 or ``batch`` elements, spread over the whole 64-bit range."""
    gen = torch.Generator().manual_seed(base)
    seed = torch.randint(-(2**63), 2**63 - 1, (batch if per_request else 1,), generator=gen)
    offset = torch.randint(0, 2**62, (batch if offset_per_request else 1,), generator=gen)
    return seed.to(device), offset.to(device)


def softmax_inputs(batch=4, num_draft=3, vocab=16, dtype=torch.float32, id_dtype=torch.int64,
                   with_draft=True, seed=0):
    """(draft, ids, target) on CPU: softmax rows of random logits, drafts sampled from the draft
    rows. Several fixed-seed expectations (tests/test_op.py) depend on exactly these values."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, num_draft + 1, vocab, generator=g), -1).to(dtype)
    q = torch.softmax(torch.randn(batch, num_draft, vocab, generator=g), -1).to(dtype)
    d = torch.multinomial(q.float().reshape(-1, vocab), 1, generator=g).reshape(batch, num_draft)
    return (q if with_draft else None), d.to(id_dtype), p


def counters(batch, dtype=torch.int32):
    """Fresh (accepted, emitted) counters."""
    return torch.zeros(batch, dtype=dtype), torch.zeros(batch, dtype=dtype)


def full_tree(width, depth):
    """Parents (M,) of the full tree of ``width`` children per node and ``depth`` levels, nodes
    numbered level by level (a parent before its children, siblings together)."""
    parents, level, following = [], [0], 1
    for _ in range(depth):
        children = []
        for node in level:
            parents += [node] * width
            children += range(following, following + width)
            following += width
        level = children
    return torch.tensor(parents, dtype=torch.int64)


def tree_inputs(batch, num_nodes, vocab, *, dtype=torch.float32, draft=True,
                ids_dtype=torch.int64, parents_dtype=torch.int64, parents=None, sharp=4.0,
                seed=0, device=DEVICE):
    """(draft_probs or None, draft_token_ids, parents, target_probs) on ``device``: random trees
    (each node's parent uniform among the nodes before it) unless ``parents`` (M,) is given,
    peaked rows, draft rows that half follow the target, and every node's token drawn from its
    parent's draft row."""
    gen = torch.Generator(device=device).manual_seed(seed)
    target = torch.rand(batch, num_nodes + 1, vocab, generator=gen, device=device) ** sharp
    target = target / target.sum(-1, keepdim=True)
    draft_probs = torch.rand(batch, num_nodes + 1, vocab, generator=gen, device=device) ** sharp
    draft_probs = 0.5 * draft_probs / draft_probs.sum(-1, keepdim=True) + 0.5 * target
    if parents is None:
        upper = torch.arange(1, num_nodes + 1, device=device)
        parents = (torch.rand(batch, num_nodes, generator=gen, device=device) * upper).long()
    else:
        parents = parents.to(device).expand(batch, num_nodes)
    rows = draft_probs[torch.arange(batch, device=device)[:, None], parents]
    ids = torch.multinomial(rows.reshape(-1, vocab), 1, generator=gen).reshape(batch, num_nodes)
    return ((draft_probs.to(dtype) if draft else None), ids.to(ids_dtype),
            parents.to(parents_dtype).contiguous(), target.to(dtype))



class Allocations(torch.utils._python_dispatch.TorchDispatchMode):
    """While active, the (shape, dtype) of every tensor an operation returns with memory of its
    own, in ``made`` (views of its inputs' memory, as Triton's interpreter makes of a kernel's
    arguments, are not allocations)."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {memory(a) for a in torch.utils._pytree.tree_leaves((args, kwargs))}
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and memory(t) not in given:
                self.made.append((tuple(t.shape), t.dtype))
        return out


def memory(value):
    """The address of a tensor's or a storage's memory (None for anything else)."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().data_ptr()
    if isinstance(value, (torch.UntypedStorage, torch.TypedStorage)):
        return value.data_ptr()
    return None
