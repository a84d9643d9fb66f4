"""Ahead-of-time compilation of the block-verification kernels for Hopper (sm_90), no GPU needed
(the approach of tests/test_triton_compile.py; tests/sass.py does the compiling and the
reading): the row pass's loops must read their rows with 16-byte loads only and stay within the
instruction budget, and nothing may spill to local memory. Compiled in a subprocess without
TRITON_INTERPRET (under the interpreter ``@triton.jit`` builds objects that cannot be compiled).

What the launcher varies (compile-time): the probability dtype, draft_probs given or None, the
16-divisibility of V, the row strides and the row pointers, and for the scan BLOCK_N
(next_pow2(N + 1)) and the id and counter dtypes.
"""

from __future__ import annotations

import json

import pytest

from compile_checks import (assert_16_byte_row_loads, assert_issue_bounds, assert_no_spills,
                            run_worker)  # tests/compile_checks.py

pytestmark = pytest.mark.sm90

PROB_DTYPES = ("fp32", "fp16", "bf16")

# (probability dtype, draft_probs given, aligned, id dtype) for the row pass;
# (dtype, draft, BLOCK_N) for the scan.
ROW_SPECS = ([(prob, draft, True, "i64") for prob in PROB_DTYPES for draft in (True, False)]
             + [(prob, draft, False, "i64") for prob in PROB_DTYPES for draft in (True, False)]
             + [("bf16", True, True, "i32")]
             # reading logits: drafts from probabilities, from logits, or neither
             + [(prob, draft, True, "i64", True, draft_logits) for prob in PROB_DTYPES
                for draft, draft_logits in ((True, False), (True, True), (False, False))]
             # a flattened batch's rows (specops.varlen), of probabilities and of logits
             + [("bf16", True, True, "i32", False, False, True),
                ("fp32", True, True, "i32", True, True, True)])
SCAN_SPECS = [("bf16", True, 4), ("fp32", False, 8), ("fp16", True, 16), ("bf16", False, 16),
              ("fp32", True, 32), ("bf16", True, 8, True), ("fp16", True, 16, True),
              ("fp32", True, 1),  # N = 0: one lane
              ("bf16", True, 16, False, True), ("fp16", True, 16, True, True),  # flattened
              ("bf16", True, 8, True, False, 15 + 16 * 8)]  # rule step 0, every part on

WORKER = r'''
import json, sys
import sass  # tests/sass.py
from specops.chain.block.launch import MAX_SPLITS, SCAN
from specops.chain.block.kernel import block_scan_kernel


def compile_scan(prob, draft, block_n, logits=False, varlen=False, step=0):
    types = {"target_ptr": "*" + prob, "draft_ptr": "*" + prob, "ids_ptr": "*i32",
             "accepted_ptr": "*i32", "emitted_ptr": "*i64", "seed_ptr": "*i64",
             "offset_ptr": "*i64", "out_ptr": "*i32", "partials_ptr": "*fp64",
             "masses_ptr": "*fp32", "target_stats_ptr": "*fp64", "draft_stats_ptr": "*fp64",
             "cu_ptr": "*i64", **sass.STEP_TYPES}
    constexprs = {"HAS_DRAFT": draft, "BLOCK_N": block_n, "BLOCK_S": MAX_SPLITS, "CHUNK": 1024,
                  "LOGITS": logits, "DRAFT_LOGITS": logits and draft, "VARLEN": varlen,
                  "STEP": step}
    return sass.compile_for_hopper(block_scan_kernel, types, constexprs,
                                          options=SCAN.options)


row_specs, scan_specs = json.loads(sys.argv[1])
out = {"row": [], "scan": []}
for prob, draft, aligned, ids, *logits in row_specs:
    kernel = sass.compile_block_row_pass(prob, draft, ids, aligned, *logits)
    found = sass.compile_report(kernel, with_row_loops=True)
    if aligned and ids == "i64":
        found["budget"] = sass.budget(prob, draft, kernel, "block")
    out["row"].append(found)
for spec in scan_specs:
    out["scan"].append(sass.compile_report(compile_scan(*spec)))
print(json.dumps(out))
'''


# The workers this module runs (conftest.py starts them ahead).
COMPILE_JOBS = [(WORKER, json.dumps([ROW_SPECS, SCAN_SPECS])),
                (WORKER, json.dumps([[], [("fp32", True, 512)]]))]


@pytest.fixture(scope="module")
def compiled():
    return run_worker(*COMPILE_JOBS[0])


def test_no_spills(compiled):
    for kind, specs in (("row", ROW_SPECS), ("scan", SCAN_SPECS)):
        for spec, res in zip(specs, compiled[kind]):
            assert_no_spills(res, (kind, spec))


def test_row_loops_use_16_byte_loads(compiled):
    for spec, res in zip(ROW_SPECS, compiled["row"]):
        prob, draft, aligned = spec[:3]
        # Draft given: the p loop (ended rows) and the residual loop; None: the p loop and the
        # w p loop (w_t < 1).
        assert set(res["row_loops"]) == ({"p", "residual"} if draft else {"p", "scaled"}), res
        if aligned:  # V % 16 != 0: rows are not 16-byte aligned, so no vector loads
            assert_16_byte_row_loads(res, prob, spec)


def test_issue_bound_beats_the_goal(compiled):
    # 3 dtypes x (draft: p only, residual read; None: p, w p), and reading logits 3 dtypes x
    # (draft probabilities: p, residual; draft logits: p, residual; None: p, w p)
    assert_issue_bounds([row for res in compiled["row"] for row in res.get("budget", [])],
                        12 + 18)


def test_scan_compiles_for_hundreds_of_drafts():
    """Drafts of 256 and more (BLOCK_N 512): the scan still sums at least one chunk a row at a
    time, so it compiles (a tile of no chunks does not)."""
    out = run_worker(*COMPILE_JOBS[1])
    assert len(out["scan"]) == 1 and out["scan"][0]["resources"]["REG"] > 0, out
