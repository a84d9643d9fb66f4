"""Ahead-of-time compilation of the Triton kernels for Hopper (sm_90), no GPU needed.

The interpreter accepts code the compiler rejects (globals that are not constexpr, unsupported
dtypes, ...), so CI also compiles the specialisations the launcher can produce and reads the
result (tests/sass.py does the compiling and the reading): the row loops must use
16-byte global loads and stay within the instruction budget, and nothing may spill to local
memory (the launch model reads each loaded kernel's registers itself: core/launch/occupancy.py).
The compilation runs in subprocesses without ``TRITON_INTERPRET`` (under the interpreter
``@triton.jit`` builds interpreter objects that cannot be compiled).

What the launcher varies (compile-time): the probability dtype, the id dtype, each counter's
dtype, draft_probs given or None, BLOCK_N (= max(4, next_pow2(N + 1))), and the 16-divisibility of
V, the row strides and the row pointers.  Everything else is a runtime argument (do_not_specialize).
"""

from __future__ import annotations

import json

import pytest

from compile_checks import (assert_16_byte_row_loads, assert_issue_bounds, assert_no_spills,
                            run_worker)  # tests/compile_checks.py

pytestmark = pytest.mark.sm90

PROB_DTYPES = ("fp32", "fp16", "bf16")


def spec(prob, draft, ids="i64", acc="i32", emit="i32", block_n=8, aligned=True, logits=False,
         draft_logits=False, varlen=False):
    return dict(prob=prob, draft=draft, ids=ids, acc=acc, emit=emit, block_n=block_n,
                aligned=aligned, logits=logits, draft_logits=draft_logits, varlen=varlen)


def all_specialisations():
    """Every probability dtype with and without draft_probs (the budgeted variants), plus the other
    id/counter dtypes, BLOCK_N values and unaligned V on a few combinations (none of them touches
    the row loops, which the registers and loop checks confirm)."""
    specs = [spec(prob, draft) for prob in PROB_DTYPES for draft in (True, False)]
    specs += [spec("bf16", True, "i32", "i64", "i64"), spec("fp32", False, "i32", "i64", "i32")]
    specs += [spec("fp16", True, block_n=n) for n in (4, 16)]
    specs += [spec(prob, draft, aligned=False) for prob in PROB_DTYPES for draft in (True, False)]
    # From logits: drafts from probabilities, from logits, or neither.
    specs += [spec(prob, draft, logits=True, draft_logits=draft_logits) for prob in PROB_DTYPES
              for draft, draft_logits in ((True, False), (True, True), (False, False))]
    # A flattened batch's rows (specops.varlen), of probabilities and of logits.
    specs += [spec("bf16", True, "i32", varlen=True),
              spec("fp32", True, "i32", logits=True, draft_logits=True, varlen=True)]
    return specs


WORKER = r'''
import json, sys
import sass  # tests/sass.py


results = []
for s in json.loads(sys.argv[1]):
    kernel = sass.compile_main(s["prob"], s["draft"], s["ids"], s["acc"], s["emit"],
                                      s["block_n"], s["aligned"], s["logits"], s["draft_logits"],
                                      s["varlen"])
    found = sass.compile_report(kernel, with_row_loops=True)
    if s["aligned"] and s["ids"] == "i64" and s["block_n"] == 8:
        found["budget"] = sass.budget(s["prob"], s["draft"], kernel)
    results.append(found)
print(json.dumps(results))
'''


# Two shards of the specialisations, each a worker (conftest.py starts them ahead).
SHARDS = [all_specialisations()[i::2] for i in range(2)]


@pytest.fixture(scope="module")
def compiled():
    results = {}
    for shard in SHARDS:
        for s, res in zip(shard, run_worker(WORKER, json.dumps(shard))):
            results[json.dumps(s, sort_keys=True)] = (s, res)
    return results


def specialisations(compiled):
    return list(compiled.values())


def test_every_specialisation_compiles_without_spills(compiled):
    assert len(compiled) == len(all_specialisations())
    for key, (s, res) in compiled.items():
        assert_no_spills(res, key)


def test_row_loops_use_16_byte_loads(compiled):
    for s, res in specialisations(compiled):
        # Draft given: the p loop and the residual loop; None: the p loop only.
        assert set(res["row_loops"]) == ({"p", "residual"} if s["draft"] else {"p"}), (s, res)
        if s["aligned"]:  # V % 16 != 0: rows are not 16-byte aligned, so no vector loads
            assert_16_byte_row_loads(res, s["prob"], s)


def test_issue_bound_beats_the_goal(compiled):
    """The row loops reading probabilities and those reading logits."""
    # 3 dtypes x (draft: p only, residual read; None: p only), and reading logits 3 dtypes x
    # (draft probabilities: p, residual; draft logits: p, residual; None: p)
    assert_issue_bounds([row for s, res in specialisations(compiled)
                         for row in res.get("budget", [])], 9 + 15)


STATISTICS_WORKER = r'''
import json, sys
import sass  # tests/sass.py
out = {}
for prob in json.loads(sys.argv[1]):
    kernel = sass.compile_statistics(prob)
    found = sass.compile_report(kernel)
    found["budget"] = sass.statistics_budget(prob, kernel)
    out[prob] = found
    out[prob + " entropy"] = sass.compile_report(sass.compile_statistics(prob, entropy=True))
    out[prob + " flattened"] = sass.compile_report(sass.compile_statistics(prob, varlen=True))
print(json.dumps(out))
'''


COMPILE_JOBS = [(WORKER, json.dumps(shard)) for shard in SHARDS] + [
    (STATISTICS_WORKER, json.dumps(["fp32", "fp16", "bf16"]))]


def test_statistics_kernel_compiles_without_spills_within_the_budget():
    """The row statistics kernel (verification from logits' first stage): no spills, and each of
    its passes over a row (the peak, the counts of top-k's bisection, the masses of top-p's and
    the last one) issue-bound above the goal in every dtype."""
    out = run_worker(*COMPILE_JOBS[-1])
    assert len(out) == 9
    for prob, report in out.items():  # and the pass that sums entropies (typical acceptance)
        assert_no_spills(report, prob)
    # 3 dtypes x (peak, 2 count passes, 3 mass passes: each pass inlined where it is called)
    assert_issue_bounds([row for report in out.values() for row in report.get("budget", [])],
                        3 * 6)
