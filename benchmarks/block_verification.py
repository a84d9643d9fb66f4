"""Block verification against token verification: what it costs, and what it gains.

    python benchmarks/block_verification.py                 # cost + tokens per call, CPU (and GPU)
    python benchmarks/block_verification.py --agreement 4000  # kernel vs reference, token for token

Cost: median time per call of both modes, eager (and CUDA-graph replay on a GPU), next to block
mode's memory floor: the bytes it must read whatever it does, target rows 2..N+1 and draft rows 2..N
(every h_t needs them), at the device's copy bandwidth. Gain: tokens per target call (emitted + 1)
of both modes when decoding with the demo's character models.
Agreement: the Triton kernel (interpreted on CPU, so use small V) against the reference over many
random requests; prints the number of requests whose output or counters differ.
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _parser.add_argument("--device", default="cuda" if "--device" not in sys.argv and
                         os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "" else "cpu")
    _parser.add_argument("--agreement", type=int, default=0, metavar="REQUESTS",
                         help="count kernel/reference mismatches over this many random requests")
    _parser.add_argument("--seed", type=int, default=0)
    ARGS = _parser.parse_args()
    if ARGS.agreement and not ARGS.device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import time  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def agreement(requests: int, device: torch.device, seed: int) -> None:
    from inputs import make_inputs, seeds
    from specops.block.launch import block_speculative_sampling_triton
    from specops.block.reference import block_speculative_sampling_reference

    g = torch.Generator().manual_seed(seed)
    done = mismatched = 0
    start = time.perf_counter()
    while done < requests:
        batch = min(64, requests - done)
        num_draft = int(torch.randint(1, 7, (1,), generator=g))
        vocab = int(torch.randint(2, 1100 if device.type == "cpu" else 70000, (1,), generator=g))
        draft = bool(torch.rand(1, generator=g) < 0.7)
        sharp = float(torch.rand(1, generator=g)) * 6 + 0.5
        q, d, p = make_inputs(batch, num_draft, vocab, draft=draft, sharp=sharp,
                              seed=seed * 100_000 + done, device=device)
        d[torch.rand(d.shape, generator=g).to(device) < 0.03] = -1
        sd, of = seeds(batch, True, base=seed * 100_000 + done, device=device)
        outs = []
        for fn in (block_speculative_sampling_reference, block_speculative_sampling_triton):
            acc = torch.zeros(batch, dtype=torch.int32, device=device)
            emit = torch.zeros_like(acc)
            outs.append((fn(q, d, p, acc, emit, sd, of), acc, emit))
        differs = ((outs[0][0] != outs[1][0]).any(1) | (outs[0][1] != outs[1][1])
                   | (outs[0][2] != outs[1][2]))
        mismatched += int(differs.sum())
        done += batch
        print(f"{done} requests, {mismatched} mismatching, {time.perf_counter() - start:.0f}s",
              flush=True)


if __name__ == "__main__":
    device = torch.device(ARGS.device)
    if ARGS.agreement:
        agreement(ARGS.agreement, device, ARGS.seed)
