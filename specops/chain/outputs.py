"""What every verifier of a chain of drafts writes: the output row and the two counters."""

from __future__ import annotations

import torch


def write_outputs(ids: torch.Tensor, kept: torch.Tensor, token: torch.Tensor,
                  accepted: torch.Tensor, accepted_num: torch.Tensor,
                  emitted_num: torch.Tensor) -> torch.Tensor:
    """output[b] = ids[b, :kept[b]], then token[b], then -1: (B, N + 1) int32; the counters are
    added to in place, in their own dtype (accepted_num += the accepted positions, emitted_num +=
    kept).

    ids: (B, N) draft ids; kept: (B,) drafts kept; token: (B,) the drawn token (-1 when none);
    accepted: (B, N) bool, each position accepted by its own coin.
    """
    num_draft = ids.shape[1]
    position = torch.arange(num_draft + 1, device=ids.device)
    padded = torch.nn.functional.pad(ids, (0, 1), value=-1)
    output = torch.where(position < kept[:, None], padded, -1)
    output = torch.where(position == kept[:, None], token[:, None], output).to(torch.int32)
    accepted_num.add_(accepted.sum(dim=1).to(accepted_num.dtype))
    emitted_num.add_(kept.to(emitted_num.dtype))
    return output


def add_counts(accepted_num: torch.Tensor | None, emitted_num: torch.Tensor | None,
               accepted: torch.Tensor, emitted: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A public function's counters after an op from logits, which returns this call's counts
    accepted and emitted (B,) int32: each counter given added to in place, in its own dtype; the
    counts themselves where none was given."""
    return tuple(counts if counter is None else counter.add_(counts)
                 for counter, counts in ((accepted_num, accepted), (emitted_num, emitted)))
