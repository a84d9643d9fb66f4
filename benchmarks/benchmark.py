"""Benchmark chain speculative sampling on whatever device is present.

    python benchmarks/benchmark.py                      # default grid (~2-3 minutes on a 2-core CPU)
    python benchmarks/benchmark.py --quick              # smoke test (seconds)
    python benchmarks/benchmark.py --point 64 4 32000   # one (B, N, V)
    python benchmarks/benchmark.py --point 1 4 32000 --rounds 9   # interleaved rounds, for ratios

Implementations compared on the same inputs:
  specops     specops.chain_speculative_sampling (the registered op)
  loop        a per-request Python loop with torch.multinomial: what a user would write
  eager       a vectorised eager-torch version that computes the residual at every position
  floor       torch.sum over the (B, 2, V) rows the op may need: one read of the needed bytes
  flashinfer  flashinfer.sampling.chain_speculative_sampling, when importable (CUDA only)

For each it reports the median latency (with ``--rounds R``, the median of R rounds in which the
implementations take turns in a new order, so that a drift of the machine's speed reaches all of
them alike), the bytes the op must move in the worst case (per request
the 2N scalars p_j[d_j], q_j[d_j], the rows p_e and q_e, the ids and the output; see
common.needed_bytes), and that traffic as a fraction of the bandwidth of a large tensor copy
measured on the same device. Writes results/benchmark.csv and, when the points form a sweep,
results/benchmark.png (needs matplotlib: pip install -e .[bench]).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import random
import statistics
import sys
from pathlib import Path

import torch

import specops
from common import (DTYPES, add_threads_option, copy_bandwidth, describe_device,
                    eager_chain_sampling, make_inputs, needed_bytes, require_device, time_eager,
                    use_threads)
from specops.demo.progress import Progress


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
    return eager_chain_sampling(draft, ids, target)


def run_floor(draft, ids, target, state):
    """One read of as many bytes as the op needs at most: two rows of every request, summed."""
    return target[:, :2].sum(dtype=torch.float32)


def flashinfer_impl():
    try:
        from flashinfer.sampling import chain_speculative_sampling as fi
    except Exception:  # not installed, or built for another torch/CUDA
        return None

    def run_flashinfer(draft, ids, target, state):
        return fi(draft, ids.int(), target)[0]

    return run_flashinfer


# ----------------------------------------------------------------------------- grid
def grid(device: torch.device, quick: bool) -> list[tuple[int, int, int]]:
    """(B, N, V) points: a vocabulary sweep at fixed batch and a batch sweep at fixed vocabulary."""
    if quick:
        vocabs, batches, fixed_b, fixed_v = [1000, 4096], [1, 8], 8, 4096
    elif device.type == "cuda":
        vocabs = [32000, 128256, 151936]
        batches, fixed_b, fixed_v = [1, 16, 64, 256, 257, 384, 600, 1024], 16, 32000
    else:
        vocabs, batches, fixed_b, fixed_v = [1000, 8000, 32000, 128256], [1, 4, 16, 64, 256], 16, 32000
    points = [(fixed_b, 4, v) for v in vocabs] + [(b, 4, fixed_v) for b in batches]
    return list(dict.fromkeys(points))  # the shared point once, order kept


def parse_args(argv=None):
    """(the parser, the parsed arguments)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--quick", action="store_true", help="tiny grid for CI smoke tests")
    parser.add_argument("--point", type=int, nargs=3, metavar=("B", "N", "V"),
                        help="measure this one configuration instead of the grid")
    parser.add_argument("--out", default="results", help="directory for benchmark.csv and .png")
    add_threads_option(parser)
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds per point, the implementations taking turns in a new order "
                             "each round; each figure is the median of its rounds (default 1)")
    parser.add_argument("--loop-max-batch", type=int, default=64,
                        help="skip the per-request loop above this batch size (it is slow)")
    args = parser.parse_args(argv)
    if args.point is not None:
        for name, value in zip(("B", "N", "V"), args.point):
            if value < 1:
                parser.error(f"--point {' '.join(map(str, args.point))}: {name} must be at least 1, got {value}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    return parser, args


def main(argv=None) -> list[dict]:
    parser, args = parse_args(argv)
    device = require_device(args.device)
    dtype = DTYPES[args.dtype]
    use_threads(parser, args.threads, device)
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
    turns = random.Random(0)
    with Progress(len(points) * len(impls) * args.rounds, "benchmark") as bar:
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
            measured = {name: [] for name in impls
                        if not (name == "loop" and (batch > args.loop_max_batch
                                                    or device.type != "cpu" and batch > 16))}
            for _ in range(args.rounds):
                order = list(measured)
                if args.rounds > 1:
                    turns.shuffle(order)
                for name in order:
                    bar.update(note=f"B={batch} V={vocab} {name}")
                    fn = impls[name]
                    measured[name].append(time_eager(lambda i: fn(*inputs[i], state), count, device,
                                                     min_time=min_time, max_reps=max_reps))
            for name, times in measured.items():
                seconds = statistics.median(times)
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
    print(f"wrote {out / 'benchmark.csv'}")
    print(plot(rows, out / "benchmark.png", bandwidth))
    return rows


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
    """The CPU targets, at B=64 and B=1 (N=4, V=32000) where those points were measured."""
    by_key = {(r["batch"], r["num_draft"], r["vocab"], r["impl"]): r["latency_us"] for r in rows}
    if (1, 4, 32000, "loop") in by_key:
        print(f"B=1 N=4 V=32000: specops / loop = "
              f"{by_key[(1, 4, 32000, 'specops')] / by_key[(1, 4, 32000, 'loop')]:.3f}"
              " (CPU target: <= 0.25)")
    if (64, 4, 32000, "specops") not in by_key:
        return
    spec = by_key[(64, 4, 32000, "specops")]
    if (64, 4, 32000, "loop") in by_key:
        print(f"B=64 N=4 V=32000: loop / specops = {by_key[(64, 4, 32000, 'loop')] / spec:.1f}x"
              " (CPU target: >= 15x)")
    print(f"B=64 N=4 V=32000: specops / floor = {spec / by_key[(64, 4, 32000, 'floor')]:.1f}x"
          " (floor: torch.sum over the (B, 2, V) needed rows; CPU target: <= 8x)")


def sweeps(rows: list[dict]) -> list[tuple[str, str, int]]:
    """(x key, fixed key, fixed value) of each sweep the rows hold: at least two x values measured
    at one value of the other dimension (and N); the fixed value with the most x values wins."""
    found = []
    for x_key, fixed_key in (("vocab", "batch"), ("batch", "vocab")):
        xs_at: dict[tuple[int, int], set] = {}
        for r in rows:
            xs_at.setdefault((r[fixed_key], r["num_draft"]), set()).add(r[x_key])
        best = max(xs_at.items(), key=lambda item: len(item[1]), default=None)
        if best is not None and len(best[1]) >= 2:
            found.append((x_key, fixed_key, best[0][0], best[0][1]))
    return found


def plot(rows: list[dict], path: Path, bandwidth: float) -> str:
    """Draw latency and bandwidth against each sweep the rows hold; returns what was written."""
    panels = sweeps(rows)
    if not panels:
        return "no plot: the points form no sweep (a plot needs two sizes along B or V)"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e '.[bench]')"
    impls = [i for i in dict.fromkeys(r["impl"] for r in rows) if i != "floor"]
    labels = {"vocab": "vocabulary size V", "batch": "batch size B"}
    fig, axes = plt.subplots(2, len(panels), figsize=(5.5 * len(panels), 8), constrained_layout=True,
                             squeeze=False)
    for col, (x_key, fixed_key, fixed, num_draft) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]

        def series(impl):
            sel = sorted((r for r in rows if r["impl"] == impl and r[fixed_key] == fixed
                          and r["num_draft"] == num_draft), key=lambda r: r[x_key])
            return [r[x_key] for r in sel], sel

        for impl in impls:
            xs, sel = series(impl)
            if xs:
                top.plot(xs, [r["latency_us"] for r in sel], marker="o", label=impl)
                bottom.plot(xs, [100 * r["fraction_of_copy_bw"] for r in sel], marker="o", label=impl)
        xs, sel = series("floor")
        if xs:
            style = dict(color="black", linestyle="--", linewidth=1, label="memory floor (one read of the needed bytes)")
            top.plot(xs, [r["latency_us"] for r in sel], **style)
            bottom.plot(xs, [100 * r["fraction_of_copy_bw"] for r in sel], **style)
        top.set(yscale="log", ylabel="latency (us)", title=f"latency, {fixed_key} = {fixed}, N = {num_draft}")
        bottom.set(yscale="log", ylabel="needed bytes / latency, % of copy bandwidth",
                   title=f"bandwidth (copy: {bandwidth / 1e9:.1f} GB/s)")
        ticks = sorted({r[x_key] for r in rows if r[fixed_key] == fixed and r["num_draft"] == num_draft})
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.set_xlabel(labels[x_key])
            # Plain integer ticks at the measured sizes (a log axis would write 2x10^0).
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(t) for t in ticks], rotation=45 if len(ticks) > 5 else 0)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
    fig.suptitle(f"chain speculative sampling on {rows[0]['device']}, {rows[0]['dtype']}, torch {torch.__version__}")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    what = " and ".join(f"{labels[x]} at {f} = {v}" for x, f, v, _ in panels)
    return f"wrote {path}: latency and bandwidth against {what}"


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
