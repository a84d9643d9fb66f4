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
    _parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    _parser.add_argument("--agreement", type=int, default=0, metavar="REQUESTS",
                         help="count kernel/reference mismatches over this many random requests")
    _parser.add_argument("--seed", type=int, default=0)
    ARGS = _parser.parse_args()
    if ARGS.agreement and ARGS.device != "cuda":
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


SHAPES = [(1, 4, 32000), (8, 4, 32000), (64, 4, 32000), (8, 4, 128256), (64, 8, 32000)]


def floor_bytes(batch: int, num_draft: int, vocab: int, dtype: torch.dtype) -> int:
    """Bytes block verification must read: target rows 2..N+1 and draft rows 2..N of each request
    (every h_t needs the whole of row t + 1), and the N ids."""
    item = torch.finfo(dtype).bits // 8
    return batch * ((2 * num_draft - 1) * vocab * item + num_draft * 8)


def cost(device: torch.device) -> None:
    import common

    import specops

    gen = torch.Generator(device=device).manual_seed(0)
    bandwidth = common.copy_bandwidth(device)
    print(f"cost on {common.describe_device(device)}, copy bandwidth {bandwidth / 1e9:.1f} GB/s "
          "(read + write)")
    print(f"{'B':>4s} {'N':>2s} {'V':>7s} {'dtype':>9s} {'token us':>10s} {'block us':>10s} "
          f"{'block/token':>11s} {'floor us':>9s} {'block/floor':>11s}")
    dtypes = (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,)
    for batch, num_draft, vocab in SHAPES:
        for dtype in dtypes:
            inputs = [common.make_inputs(batch, num_draft, vocab, dtype, device, gen) for _ in range(4)]
            seed = torch.tensor([1], device=device)
            offset = torch.tensor([0], device=device)
            acc = torch.zeros(batch, dtype=torch.int32, device=device)
            emit = torch.zeros_like(acc)
            times = {}
            for mode in ("token", "block"):
                op = (torch.ops.specops.chain_speculative_sampling if mode == "token"
                      else torch.ops.specops.chain_block_speculative_sampling)

                def call(i, op=op):
                    q, d, p = inputs[i]
                    return op(q, d, p, acc, emit, seed, offset)

                times[mode] = common.time_eager(call, len(inputs), device)
                if common.can_graph(device):
                    times[mode] = min(times[mode], common.time_graph(call, len(inputs), device))
            floor = floor_bytes(batch, num_draft, vocab, dtype) / (bandwidth / 2)  # read only
            print(f"{batch:4d} {num_draft:2d} {vocab:7d} {str(dtype)[6:]:>9s} "
                  f"{times['token'] * 1e6:10.1f} {times['block'] * 1e6:10.1f} "
                  f"{times['block'] / times['token']:11.2f} {floor * 1e6:9.1f} "
                  f"{times['block'] / floor:11.2f}", flush=True)


def tokens_per_call(device: torch.device) -> None:
    import contextlib
    import io

    from specops import demo

    print("\ntokens per target call on the demo's models (64 sequences x 256 characters, eager)")
    for num_draft in (2, 4, 8):
        figures = []
        for mode in ("token", "block"):
            with contextlib.redirect_stdout(io.StringIO()):
                result = demo.main(["--device", device.type, "--verification", mode, "--draft-len",
                                    str(num_draft), "--batch-size", "64", "--length", "256",
                                    "--no-compile"])
            figures.append(f"{mode} {result['characters_per_call']:.3f}"
                           f" (lossless {'PASS' if result['lossless'] else 'FAIL'})")
        print(f"  N = {num_draft}: " + ", ".join(figures), flush=True)


if __name__ == "__main__":
    device = torch.device(ARGS.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if ARGS.agreement:
        agreement(ARGS.agreement, device, ARGS.seed)
    else:
        cost(device)
        tokens_per_call(device)
