"""Ahead-of-time compilation of the tree kernel for Hopper (sm_90), no GPU needed (the approach of
tests/test_triton_compile.py; benchmarks/sass_budget.py does the compiling and the reading): its
row loops must read their rows with 16-byte loads only and stay within the instruction budget, and
nothing may spill to local memory. Compiled in a subprocess without TRITON_INTERPRET (under the
interpreter ``@triton.jit`` builds objects that cannot be compiled).

What the launcher varies (compile-time): the probability dtype, draft_probs given or None,
BLOCK_M (next_pow2(M + 1), at least 16), the id and parent dtypes, and the 16-divisibility of V,
the row strides and the row pointers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROB_DTYPES = ("fp32", "fp16", "bf16")

# (probability dtype, draft_probs given, aligned, id dtype, parent dtype, BLOCK_M)
SPECS = ([(prob, draft, True, "i64", "i64", 16) for prob in PROB_DTYPES for draft in (True, False)]
         + [("bf16", False, False, "i64", "i64", 16), ("fp32", True, False, "i32", "i32", 1024)])

WORKER = r'''
import inspect, json, sys
from triton.compiler import ASTSource
import sass_budget  # benchmarks/

if "constexprs" not in inspect.signature(ASTSource.__init__).parameters:
    print(json.dumps({"skip": "ASTSource API of triton < 3.3"}))
    sys.exit(0)

out = []
for prob, draft, aligned, ids, parents, block_m in json.loads(sys.argv[1]):
    kernel = sass_budget.compile_tree(prob, draft, ids, parents, block_m, aligned)
    found = sass_budget.compile_report(kernel, with_row_loops=True)
    if aligned and block_m == 16 and "row_loops" in found:
        found["budget"] = sass_budget.budget(prob, draft, kernel, "tree")
    out.append(found)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "benchmarks"),
                                         env.get("PYTHONPATH", "")])
    args = [sys.executable, "-c", WORKER, json.dumps(SPECS)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if isinstance(out, dict) and "skip" in out:
        pytest.skip(out["skip"])
    return out


def test_no_spills(compiled):
    for spec, res in zip(SPECS, compiled):
        assert not res["local_in_ptx"], spec
        if "resources" in res:  # cuobjdump ships with triton's NVIDIA backend
            r = res["resources"]
            assert r.get("LOCAL", 0) == 0 and r.get("STACK", 0) == 0, (spec, r)
            assert res["spills"] == 0 and r["REG"] <= 255, (spec, r)


def test_row_loops_use_16_byte_loads(compiled):
    for (prob, draft, aligned, *_), res in zip(SPECS, compiled):
        if "row_loops" not in res:
            continue
        # Draft given: the residual loop (a rejection's pass) and the p loop (a leaf's draw);
        # target-only: the p loop.
        assert set(res["row_loops"]) == ({"p", "residual"} if draft else {"p"}), res
        if not aligned:
            continue  # V % 16 != 0: rows are not 16-byte aligned, so no vector loads
        # 1024 values over 128 threads: 8 per thread = 2 (fp32) or 1 (fp16/bf16) 16-byte loads
        # per row per chunk, and no narrower load.
        per_row = 2 if prob == "fp32" else 1
        for name, loop in res["row_loops"].items():
            rows = 2 if name == "residual" else 1
            assert loop["loads16"] == per_row * rows and loop["other_loads"] == 0, (prob, name)


def test_issue_bound_beats_the_goal(compiled):
    """Every variant's row loop can stream faster than 1.25 x the H200's 4.8 TB/s on instruction
    issue alone (benchmarks/sass_budget.py prints the table)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from sass_budget import GOAL_BYTES_PER_S

    budgets = [row for res in compiled for row in res.get("budget", [])]
    if not budgets:
        pytest.skip("no nvdisasm beside this triton")
    assert len(budgets) == 9  # 3 dtypes x (draft: p, residual read; None: p)
    for row in budgets:
        assert row["issue_bound"] >= GOAL_BYTES_PER_S, row
