"""Input builders shared by the tests that compare implementations (the Triton kernel against the
reference, on the interpreter and on a GPU). Tests whose fixed-seed expectations pin the inputs
(tests/test_op.py) keep their own builders: changing those would change every pinned token."""

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
