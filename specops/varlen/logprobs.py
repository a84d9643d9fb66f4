"""What ``specops.varlen``'s verifier from logits adds to its outputs when a caller asks for
logprobs: each output position mapped to its flattened row (``chain/logprobs.py`` and
``tree/logprobs.py`` do it for the padded layouts)."""

from __future__ import annotations

import torch

from ..chain.from_logits_triton import adjusted_target_logits
from ..chain.rows import Flattened
from ..core.logits.rule import Step
from ..core.logprobs.outputs import gathered, run
from ..core.sampling.flattened import Padded


def varlen_logprobs(mode, num_top: int, target_logits, draft_token_ids, cu_num_draft_tokens,
                    max_num_draft_tokens: int, output, parameters, step: Step,
                    order: str) -> tuple:
    """A flattened batch's (B, max + 1) outputs' logprobs: request b's position j under row
    cu[b] + b + j of the (T + B, V) rows, each row taken as a request of one row."""
    if mode is None:
        return ()
    layout = Flattened(cu_num_draft_tokens, max_num_draft_tokens)
    if mode == "processed":
        target_logits = adjusted_target_logits(target_logits, draft_token_ids, step, layout)
    rows = target_logits.shape[0]
    source = Padded(cu_num_draft_tokens, draft_token_ids.shape[0],
                    max_num_draft_tokens).target_rows.clamp(0, max(rows - 1, 0))  # (B, max + 1)
    has = output >= 0
    slot = torch.where(has, source, rows).reshape(-1)  # rows: a spare slot for the padding
    tokens = output.new_full((rows + 1,), -1).scatter(0, slot, output.reshape(-1))[:rows]
    request = torch.arange(output.shape[0], device=output.device)[:, None].expand_as(output)
    owner = torch.zeros(rows + 1, dtype=torch.int64, device=output.device).scatter(
        0, slot, request.reshape(-1))[:rows]
    parameters = tuple(value if value.shape[0] == 1 else value[owner] for value in parameters)
    result = run(mode, num_top, target_logits[:, None], tokens[:, None], parameters, order)
    return gathered(result, source, has)
