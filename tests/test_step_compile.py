"""Ahead-of-time compilation for Hopper (sm_90) of the kernels that apply rule step 0 as they read
the target's logits (core/sampling/step_triton.py), no GPU needed (the approach of
tests/test_triton_compile.py; tests/sass.py does the compiling and the reading).

Step 0 reads, besides each logit, a float32 bias, an int32 count, a prompt mask's byte and a bit
of the grammar mask, and counts the drafts before the row. With every part on: nothing may spill,
the rows and the bias and counts must still be read with 16-byte loads, and each row loop must
issue fast enough for what it moves (the logits and step 0's inputs: sass.EVERY_STEP_INPUTS)
to stream faster than 1.25 x the H200's bandwidth. Chains of more than 16 drafts (trees of more
than 16 nodes) count them in a loop inside the row loops (LONG_SPECS): checked for spills only.
"""

from __future__ import annotations

import json

import pytest

import sass  # tests/sass.py
from compile_checks import assert_issue_bounds, assert_no_spills, run_worker

pytestmark = pytest.mark.sm90

EVERY = 15 + 16 * 8  # every part on (sass.EVERY_STEP_PART), up to 8 drafts before a row
LONG = 15 + 16 * 32  # up to 32 drafts: counted in a loop inside the row loops, not unrolled

# (kernel, dtype, draft_probs given, draft logits, flattened, STEP)
SPECS = [("token", "bf16", True, False, False, EVERY), ("token", "fp32", True, False, False, EVERY),
         ("token", "fp16", False, False, False, EVERY),
         ("token", "bf16", True, True, True, EVERY),
         ("token", "bf16", True, False, False, 1),  # the bias alone
         ("block", "bf16", True, False, False, EVERY), ("block", "fp32", True, False, False, EVERY),
         ("block", "fp16", False, False, False, EVERY),
         ("statistics", "bf16", None, None, False, EVERY),
         ("statistics", "fp32", None, None, False, EVERY),
         ("statistics", "fp16", None, None, True, EVERY),
         ("tree", "bf16", True, True, False, EVERY), ("tree", "fp32", False, False, False, EVERY),
         ("traversal", "bf16", True, False, False, EVERY)]
# Checked for spills only: the row loops holding the draft loop, and the statistics kernel's
# entropy pass (typical acceptance).
LONG_SPECS = [("token", "bf16", True, False, False, LONG),
              ("block", "fp32", True, False, False, LONG),
              ("statistics", "bf16", None, None, False, LONG),
              ("tree", "bf16", True, False, False, LONG),
              ("traversal", "fp32", True, True, False, LONG),
              ("entropy", "fp32", None, None, True, EVERY)]

WORKER = r'''
import json, sys
import sass  # tests/sass.py

out = []
specs, long_specs = json.loads(sys.argv[1])
for kind, prob, draft, draft_logits, varlen, step in specs + long_specs:
    step_inputs = sass.EVERY_STEP_INPUTS if step % 16 == 15 else sass.BIAS_INPUTS
    budgeted = [kind, prob, draft, draft_logits, varlen, step] in specs
    if kind in ("tree", "traversal"):
        compile = sass.compile_tree if kind == "tree" else sass.compile_traversal
        kernel = compile(prob, draft, logits=True, draft_logits=draft_logits, step=step)
        found = sass.compile_report(kernel, with_row_loops=budgeted)
        if budgeted:
            found["budget"] = sass.budget(prob, draft, kernel, kind, " step 0", step_inputs)
    elif kind in ("statistics", "entropy"):
        kernel = sass.compile_statistics(prob, varlen, step, entropy=kind == "entropy")
        found = sass.compile_report(kernel)
        if budgeted:
            found["budget"] = sass.statistics_budget(prob, kernel, " step 0", step_inputs)
    else:
        compile = sass.compile_main if kind == "token" else sass.compile_block_row_pass
        extra = {"block_n": 8} if kind == "token" else {}
        kernel = compile(prob, draft, logits=True, draft_logits=draft_logits, varlen=varlen,
                         step=step, **extra)
        found = sass.compile_report(kernel, with_row_loops=budgeted)
        if budgeted:
            found["budget"] = sass.budget(prob, draft, kernel, kind, " step 0", step_inputs)
    out.append(found)
print(json.dumps(out))
'''

COMPILE_JOBS = [(WORKER, json.dumps([SPECS[i::2], LONG_SPECS[i::2]])) for i in range(2)]


@pytest.fixture(scope="module")
def compiled():
    """(spec, report) of every spec, SPECS' and LONG_SPECS'."""
    return [pair for i, job in enumerate(COMPILE_JOBS)
            for pair in zip(SPECS[i::2] + LONG_SPECS[i::2], run_worker(*job))]


def test_no_spills(compiled):
    assert len(compiled) == len(SPECS) + len(LONG_SPECS)
    for spec, report in compiled:
        assert_no_spills(report, spec)


def test_rows_bias_and_counts_use_16_byte_loads(compiled):
    for spec, report in compiled:
        kind, prob, draft, _, _, step = spec
        if kind == "statistics" or spec in LONG_SPECS:
            continue
        expected = ({"p", "residual"} if draft else {"p", "scaled"} if kind == "block" else
                    {"p"})
        assert set(report["row_loops"]) == expected, (spec, report)
        # Counted over the whole loop (a compiler may give a row's load a line of step 0's, or
        # the other way): a row read a narrower way, or the bias or counts, would leave fewer
        # 16-byte loads than each chunk an iteration reads takes.
        inputs = sass.EVERY_STEP_INPUTS if step == EVERY else sass.BIAS_INPUTS
        for name, loop in report["row_loops"].items():
            per_chunk = sass.loads16_per_chunk(2 if name == "residual" else 1,
                                               sass.PROB_DTYPES[prob], report["num_warps"], inputs)
            assert loop["all_loads16"] > 0 and loop["all_loads16"] % per_chunk == 0, (
                spec, name, loop)


def test_issue_bound_beats_the_goal(compiled):
    # token: p and residual (draft given), p (None); block: p and residual, p and w p; the
    # statistics kernel: each kind of pass (peak, count, mass) found, however many of their
    # inlined copies ptxas leaves as loops of their own; trees as token
    rows = [row for _, report in compiled for row in report.get("budget", [])]
    for spec, report in compiled:
        if spec[0] == "statistics" and spec in SPECS:
            passes = {row["variant"].split()[-2] for row in report["budget"]}
            assert passes == {"peak", "count", "mass"}, (spec, report["budget"])
    assert_issue_bounds(rows, len(rows))
    assert len(rows) >= 2 + 2 + 1 + 2 + 2 + 2 + 2 + 2 + 3 * 3 + 2 + 1 + 2
