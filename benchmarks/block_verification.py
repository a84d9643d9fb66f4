"""Block verification against token verification: what it costs, and what it gains.

    python benchmarks/block_verification.py                 # cost + tokens per call, CPU (and GPU)

Cost: median time per call of both modes, eager (and CUDA-graph replay on a GPU), next to block
mode's memory floor: the bytes it must read whatever it does, target rows 2..N+1 and draft rows 2..N
(every h_t needs them), at the device's copy bandwidth. Gain: tokens per target call (emitted + 1)
of both modes when decoding with the demo's character models.
The kernel's agreement with the reference is measured by
``benchmarks/measure_agreement.py --verification block``.
"""

from __future__ import annotations

import argparse

import torch

import common  # benchmarks/common.py: a script's own folder is on sys.path


SHAPES = [(1, 4, 32000), (8, 4, 32000), (64, 4, 32000), (8, 4, 128256), (64, 8, 32000)]


def floor_bytes(batch: int, num_draft: int, vocab: int, dtype: torch.dtype) -> int:
    """Bytes block verification must read: target rows 2..N+1 and draft rows 2..N of each request
    (every h_t needs the whole of row t + 1), and the N ids."""
    item = torch.finfo(dtype).bits // 8
    return batch * ((2 * num_draft - 1) * vocab * item + num_draft * 8)


def cost(device: torch.device) -> None:

    import specops  # noqa: F401 (registers torch.ops.specops)

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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    common.add_threads_option(parser)
    args = parser.parse_args()
    device = common.require_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    common.use_threads(parser, args.threads, device)
    cost(device)
    tokens_per_call(device)
