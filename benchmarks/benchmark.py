"""Benchmark chain speculative sampling on whatever device is present.

    python benchmarks/benchmark.py            # default grid (~2-3 minutes on a 2-core CPU)
    python benchmarks/benchmark.py --quick    # smoke test (seconds)
    python benchmarks/benchmark.py --point 64 4 32000   # one (B, N, V): issue 2's CPU ratios

Implementations compared on the same inputs:
  specops     specops.chain_speculative_sampling (the registered op)
  loop        a per-request Python loop with torch.multinomial: what a user would write
  eager       a vectorised eager-torch version that computes the residual at every position
  floor       torch.sum over the (B, 2, V) rows the op must read: one pass over the needed bytes
  flashinfer  flashinfer.sampling.chain_speculative_sampling, when importable (CUDA only)

For each it reports the median latency, the bytes the op must move (SPEC.md's performance model:
per request the 2N scalars p_j[d_j], q_j[d_j], the rows p_e and q_e, the ids and the output), and
that traffic as a fraction of the bandwidth of a large tensor copy measured on the same device.
Writes results/benchmark.csv and results/benchmark.png (needs matplotlib: pip install -e .[bench]).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import specops
from specops.progress import Progress

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# ----------------------------------------------------------------------------- inputs
def make_inputs(batch: int, num_draft: int, vocab: int, dtype: torch.dtype, device, gen):
    """Target/draft probabilities that agree roughly (acceptance ~0.5-0.8), drafts sampled from q."""
    logits = torch.randn(batch, num_draft + 1, vocab, generator=gen) * 3
    target = logits.softmax(-1)
    draft = (logits[:, :num_draft] + torch.randn(batch, num_draft, vocab, generator=gen)).softmax(-1)
    exp = torch.empty_like(draft).exponential_(generator=gen)
    ids = (draft / exp).argmax(-1)  # one sample of q per position (exponential race)
    return (draft.to(device, dtype), ids.to(device), target.to(device, dtype))


# ----------------------------------------------------------------------------- implementations
def run_specops(draft, ids, target, state):
    return specops.chain_speculative_sampling(
        draft, ids, target, state["accepted"], state["emitted"],
        seed=state["seed"], offset=state["offset"],
    )[0]


def run_loop(draft, ids, target, state):
    """Per request, per position, as in the papers; one host sync per coin."""
    batch, num_draft = ids.shape
    out = torch.full((batch, num_draft + 1), -1, dtype=torch.int32)
    for b in range(batch):
        for j in range(num_draft):
            d = int(ids[b, j])
            p, q = target[b, j].float(), draft[b, j].float()
            if float(torch.rand(())) * float(q[d]) < float(p[d]):
                out[b, j] = d
                continue
            residual = (p - q).clamp_min(0)
            out[b, j] = int(torch.multinomial(residual / residual.sum(), 1))
            break
        else:
            out[b, num_draft] = int(torch.multinomial(target[b, num_draft].float(), 1))
    return out


def run_eager(draft, ids, target, state):
    """Vectorised torch that forms the residual at every position, then picks the row at e."""
    batch, num_draft = ids.shape
    p, q = target.float(), draft.float()
    p_d = p[:, :num_draft].gather(2, ids[..., None]).squeeze(2)
    q_d = q.gather(2, ids[..., None]).squeeze(2)
    accepted = torch.rand(batch, num_draft, device=p.device) * q_d < p_d
    rejected = ~accepted
    e = torch.where(rejected.any(1), rejected.int().argmax(1), num_draft)
    residual = torch.cat([(p[:, :num_draft] - q).clamp_min(0), p[:, num_draft:]], dim=1)
    rows = residual[torch.arange(batch, device=p.device), e]
    token = torch.multinomial(rows / rows.sum(-1, keepdim=True), 1).squeeze(1)
    out = torch.where(torch.arange(num_draft + 1, device=p.device) < e[:, None],
                      torch.cat([ids, ids[:, :1]], dim=1), -1)
    out[torch.arange(batch, device=p.device), e] = token
    return out


def run_floor(draft, ids, target, state):
    """One read of as many bytes as the op needs: two rows of every request, summed."""
    return target[:, :2].sum(dtype=torch.float32)


def flashinfer_impl():
    try:
        from flashinfer.sampling import chain_speculative_sampling as fi
    except Exception:  # not installed, or built for another torch/CUDA
        return None

    def run_flashinfer(draft, ids, target, state):
        return fi(draft, ids.int(), target)[0]

    return run_flashinfer


# ----------------------------------------------------------------------------- measurement
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, input_sets, state, device, min_time: float, max_reps: int) -> float:
    """Median seconds per call, rotating over input sets so no call reads a cached copy."""
    for inputs in input_sets[:2]:  # warm-up (first-call setup, autotuning)
        fn(*inputs, state)
    sync(device)
    times: list[float] = []
    total = 0.0
    while (total < min_time or len(times) < 3) and len(times) < max_reps:
        inputs = input_sets[len(times) % len(input_sets)]
        if device.type == "cuda":
            start_ev = torch.cuda.Event(enable_timing=True)
            end_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
            fn(*inputs, state)
            end_ev.record()
            end_ev.synchronize()
            elapsed = start_ev.elapsed_time(end_ev) / 1e3
        else:
            start = time.perf_counter()
            fn(*inputs, state)
            elapsed = time.perf_counter() - start
        times.append(elapsed)
        total += elapsed
    return statistics.median(times)


def copy_bandwidth(device: torch.device, megabytes: int) -> float:
    """Bytes per second of a large tensor copy (read + write counted) on ``device``."""
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def needed_bytes(batch: int, num_draft: int, vocab: int, dtype: torch.dtype, id_bytes: int = 8) -> int:
    """SPEC.md's performance model with the rejection case (two rows): the fewest bytes per call."""
    elem = torch.finfo(dtype).bits // 8
    per_request = (2 * num_draft * elem  # p_j[d_j] and q_j[d_j]
                   + 2 * vocab * elem  # p_e and q_e
                   + num_draft * id_bytes  # draft ids
                   + (num_draft + 1) * 4)  # output ids
    return batch * per_request


# ----------------------------------------------------------------------------- grid
def grid(device: torch.device, quick: bool) -> list[tuple[int, int, int]]:
    """(B, N, V) points: a vocabulary sweep at fixed batch and a batch sweep at V = 32000."""
    if quick:
        vocabs, batches, fixed_b, fixed_v = [1000, 4096], [1, 8], 8, 4096
    elif device.type == "cuda":
        vocabs, batches, fixed_b, fixed_v = [32000, 128256, 151936], [1, 16, 64, 256, 1024], 16, 32000
    else:
        vocabs, batches, fixed_b, fixed_v = [1000, 8000, 32000, 128256], [1, 4, 16, 64, 256], 16, 32000
    points = [(fixed_b, 4, v) for v in vocabs] + [(b, 4, fixed_v) for b in batches]
    return list(dict.fromkeys(points))  # the shared point once, order kept


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--quick", action="store_true", help="tiny grid for CI smoke tests")
    parser.add_argument("--point", type=int, nargs=3, metavar=("B", "N", "V"),
                        help="measure this one configuration instead of the grid")
    parser.add_argument("--out", default="results", help="directory for benchmark.csv and .png")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for torch (default 1: stable figures on a shared machine)")
    parser.add_argument("--loop-max-batch", type=int, default=64,
                        help="skip the per-request loop above this batch size (it is slow)")
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    min_time, max_reps = (0.02, 5) if args.quick else (0.5, 200) if device.type == "cpu" else (0.2, 500)
    rotate_bytes = (32 if args.quick else 256) * 2**20  # input copies per point up to this size

    impls = {"specops": run_specops, "loop": run_loop, "eager": run_eager, "floor": run_floor}
    if device.type == "cuda" and (fi := flashinfer_impl()) is not None:
        impls["flashinfer"] = fi
    print(f"specops {specops.__version__} benchmark | {describe_device(device)} | torch {torch.__version__}"
          f" | {args.dtype} | {datetime.date.today().isoformat()}")
    bandwidth = copy_bandwidth(device, 32 if args.quick else 256)
    print(f"measured copy bandwidth: {bandwidth / 1e9:.1f} GB/s")

    points = [tuple(args.point)] if args.point else grid(device, args.quick)
    gen = torch.Generator().manual_seed(0)
    rows = []
    with Progress(len(points) * len(impls), "benchmark") as bar:
        for batch, num_draft, vocab in points:
            per_set = 2 * batch * (num_draft + 1) * vocab * (torch.finfo(dtype).bits // 8)
            count = max(1, min(64, rotate_bytes // per_set))
            inputs = [make_inputs(batch, num_draft, vocab, dtype, device, gen) for _ in range(count)]
            state = {
                "accepted": torch.zeros(batch, dtype=torch.int32, device=device),
                "emitted": torch.zeros(batch, dtype=torch.int32, device=device),
                "seed": torch.tensor([1234], device=device),
                "offset": torch.tensor([0], device=device),
            }
            moved = needed_bytes(batch, num_draft, vocab, dtype)
            for name, fn in impls.items():
                bar.update(note=f"B={batch} V={vocab} {name}")
                if name == "loop" and (batch > args.loop_max_batch or device.type != "cpu" and batch > 16):
                    continue
                seconds = time_call(fn, inputs, state, device, min_time, max_reps)
                rows.append({
                    "device": describe_device(device), "dtype": args.dtype, "batch": batch,
                    "num_draft": num_draft, "vocab": vocab, "impl": name,
                    "latency_us": seconds * 1e6, "needed_bytes": moved,
                    "needed_GBps": moved / seconds / 1e9,
                    "fraction_of_copy_bw": moved / seconds / bandwidth,
                })
            del inputs, state

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "benchmark.csv")
    print_table(rows)
    print_ratios(rows)
    if plot(rows, out / "benchmark.png", bandwidth):
        print(f"wrote {out / 'benchmark.csv'} and {out / 'benchmark.png'}")
    else:
        print(f"wrote {out / 'benchmark.csv'} (no plot: pip install matplotlib)")
    return rows


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.machine()} x{torch.get_num_threads()} thread(s)"


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in row.items()})


def print_table(rows: list[dict]) -> None:
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    points = list(dict.fromkeys((r["batch"], r["num_draft"], r["vocab"]) for r in rows))
    by_key = {(r["batch"], r["num_draft"], r["vocab"], r["impl"]): r for r in rows}
    header = f"{'B':>5} {'N':>2} {'V':>7} {'needed':>9} " + " ".join(f"{i + ' us':>13}" for i in impls)
    print("\nlatency (median); specops's needed bytes as a fraction of copy bandwidth in brackets")
    print(header)
    for b, n, v in points:
        cells = []
        for impl in impls:
            r = by_key.get((b, n, v, impl))
            cells.append(f"{'-':>13}" if r is None else f"{r['latency_us']:13.1f}")
        spec = by_key[(b, n, v, "specops")]
        print(f"{b:5d} {n:2d} {v:7d} {spec['needed_bytes'] / 1e6:7.2f}MB " + " ".join(cells)
              + f"  [{spec['fraction_of_copy_bw']:.1%}]")


def print_ratios(rows: list[dict]) -> None:
    """The ratios issue 2 asks for, at B=64, N=4, V=32000 when that point was measured."""
    by_key = {(r["batch"], r["vocab"], r["impl"]): r["latency_us"] for r in rows}
    if (64, 32000, "specops") not in by_key:
        return
    spec = by_key[(64, 32000, "specops")]
    if (64, 32000, "loop") in by_key:
        print(f"B=64 N=4 V=32000: specops is {by_key[(64, 32000, 'loop')] / spec:.1f}x faster than the loop"
              " (issue 2 goal: >= 15x)")
    print(f"B=64 N=4 V=32000: specops takes {spec / by_key[(64, 32000, 'floor')]:.1f}x one read of the "
          "needed rows (torch.sum over (B, 2, V); issue 2 goal: <= 8x)")


def plot(rows: list[dict], path: Path, bandwidth: float) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    # The two sweeps: fixed batch (varying V) and fixed vocabulary (varying B).
    counts_b = {}
    for r in rows:
        counts_b[r["batch"]] = counts_b.get(r["batch"], 0) + 1
    fixed_b = max(counts_b, key=counts_b.get)
    counts_v = {}
    for r in rows:
        counts_v[r["vocab"]] = counts_v.get(r["vocab"], 0) + 1
    fixed_v = max(counts_v, key=counts_v.get)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    sweeps = [("vocab", "batch", fixed_b, "vocabulary size V"), ("batch", "vocab", fixed_v, "batch size B")]
    for col, (x_key, fixed_key, fixed, label) in enumerate(sweeps):
        for impl in impls:
            sel = sorted((r for r in rows if r["impl"] == impl and r[fixed_key] == fixed),
                         key=lambda r: r[x_key])
            if len(sel) < 2:
                continue
            xs = [r[x_key] for r in sel]
            axes[0][col].plot(xs, [r["latency_us"] for r in sel], marker="o", label=impl)
            axes[1][col].plot(xs, [100 * r["fraction_of_copy_bw"] for r in sel], marker="o", label=impl)
        axes[0][col].set(xscale="log", yscale="log", xlabel=label, ylabel="latency (us)",
                         title=f"latency, {fixed_key} = {fixed}, N = 4")
        axes[1][col].set(xscale="log", yscale="log", xlabel=label,
                         ylabel="needed bytes / latency, % of copy bandwidth",
                         title=f"bandwidth (copy: {bandwidth / 1e9:.1f} GB/s)")
        for ax in (axes[0][col], axes[1][col]):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    device = rows[0]["device"]
    fig.suptitle(f"chain speculative sampling on {device}, {rows[0]['dtype']}, torch {torch.__version__}")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
