"""Instruction budget of the row loops of the chain kernel, of the block-verification row pass, of
the tree and traversal kernels and of the row statistics kernel, read from their SASS (sm_90
compile, no GPU): per variant the instructions per byte and the bytes per second an H200 could
stream on instruction issue alone (tests/sass.py says how they are read); then the chain kernels
and the statistics kernel applying rule step 0 with every part on, their bytes counting what step
0 reads besides the logits.

    python benchmarks/sass_budget.py            # the tables (a few minutes)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from sass import (COMPILERS, EVERY_STEP_INPUTS, EVERY_STEP_PART, GOAL_BYTES_PER_S,  # noqa: E402
                  PROB_DTYPES, budget, compile_statistics, resources, statistics_budget)

EVERY_STEP = EVERY_STEP_PART + 16 * 8  # every part, up to 8 drafts before a row


def print_header(title: str) -> None:
    print(f"{title:46} {'instr/chunk/warp':>16} {'bytes/chunk':>11} {'instr/byte':>10} "
          f"{'issue bound':>12}")


def print_row(row: dict) -> None:
    print(f"{row['variant']:46} {row['instructions_per_chunk']:16.1f} {row['bytes_per_chunk']:11.0f} "
          f"{row['instructions_per_byte']:10.4f} {row['issue_bound'] / 1e12:9.2f} TB/s")


def report(kernel, rows: list[dict]) -> bool:
    """Print a kernel variant's budget rows and its registers; whether every row meets the goal."""
    for row in rows:
        print_row(row)
    print(f"{'':46} registers per thread: {resources(kernel.asm['cubin'])['REG']}")
    return all(row["issue_bound"] >= GOAL_BYTES_PER_S for row in rows)


def main() -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    ok = True
    for sampler, compile_variant in COMPILERS.items():
        print_header(sampler + " kernel")
        for prob in PROB_DTYPES:
            for draft in (True,) if sampler == "traversal" else (True, False):  # draft rows read
                kernel = compile_variant(prob, draft)
                ok &= report(kernel, budget(prob, draft, kernel, sampler))
        print()
    # The chain kernels reading logits through their rows' statistics (drafts from probabilities,
    # from logits, or neither).
    for sampler in ("chain", "block"):
        print_header(sampler + " kernel from logits")
        for prob in PROB_DTYPES:
            for draft, draft_logits in ((True, False), (True, True), (False, False)):
                kernel = COMPILERS[sampler](prob, draft, logits=True, draft_logits=draft_logits)
                label = " logits" + (" draft logits" if draft_logits else "")
                ok &= report(kernel, budget(prob, draft, kernel, sampler, label))
        print()
    print_header("row statistics kernel (verification from logits)")
    for prob in PROB_DTYPES:
        kernel = compile_statistics(prob)
        ok &= report(kernel, statistics_budget(prob, kernel))
    print()
    for sampler in ("chain", "block"):
        print_header(sampler + " kernel from logits, step 0")
        for prob in PROB_DTYPES:
            for draft in (True, False):
                kernel = COMPILERS[sampler](prob, draft, logits=True, step=EVERY_STEP)
                ok &= report(kernel, budget(prob, draft, kernel, sampler, " step 0",
                                            EVERY_STEP_INPUTS))
        print()
    print_header("row statistics kernel, step 0")
    for prob in PROB_DTYPES:
        kernel = compile_statistics(prob, step=EVERY_STEP)
        ok &= report(kernel, statistics_budget(prob, kernel, " step 0", EVERY_STEP_INPUTS))
    print()
    verdict = "met" if ok else "NOT met"
    print(f"goal: {GOAL_BYTES_PER_S / 1e12:.2f} TB/s for every variant: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
