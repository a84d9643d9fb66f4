"""The chain kernel's part of the launch model (``specops/core/occupancy.py``): its registers per
thread, and the programs per request ``launch_plan`` picks for it.  docs/kernel.md tabulates the
result; tests/test_launch.py checks it over B and V.
"""

from __future__ import annotations

import functools

import torch

from ..core.occupancy import RowPass

NUM_WARPS = 4
# Most programs per request: the combine kernel reads them in one block.
MAX_PROGRAMS_PER_REQUEST = 256
# Registers per thread of the compiled kernel (Triton 3.9.0, sm_90, num_warps=4), by probability
# dtype, draft_probs given, and V % 16 == 0 (16-byte row loads; else scalar loads and many more
# registers). tests/test_triton_compile.py checks them against every variant it compiles.
REGISTERS = {
    (torch.float32, True, True): 56,
    (torch.float32, False, True): 64,
    (torch.float16, True, True): 56,
    (torch.float16, False, True): 64,
    (torch.bfloat16, True, True): 56,
    (torch.bfloat16, False, True): 64,
    (torch.float32, True, False): 110,
    (torch.float32, False, False): 119,
    (torch.float16, True, False): 96,
    (torch.float16, False, False): 116,
    (torch.bfloat16, True, False): 110,
    (torch.bfloat16, False, False): 116,
}
ROW_PASS = RowPass(REGISTERS, NUM_WARPS, MAX_PROGRAMS_PER_REQUEST)
programs_held = ROW_PASS.programs_held
launch_plan = functools.lru_cache(maxsize=4096)(ROW_PASS.plan)  # (batch, vocab, dtype, has_draft)


def programs_per_request(batch: int, vocab: int, dtype: torch.dtype, has_draft: bool) -> int:
    return launch_plan(batch, vocab, dtype, has_draft).programs_per_request
