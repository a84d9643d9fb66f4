"""What every benchmark script shares: timing, the device's copy bandwidth, the byte model, inputs,
and the eager-torch baseline.

Scripts in this folder import it as ``import common`` (a script's own folder is on ``sys.path``).

Timing (all return median seconds per call):
    time_eager(fn, count, device)    fn(i) called eagerly, i rotating over range(count)
    time_graph(fn, count, device)    fn(0..count-1) captured in one CUDA graph, then replayed
    can_graph(device)                whether time_graph works on ``device`` (CUDA only)
    captured(call)                   a CUDA graph of call(), after a warm-up call on a side stream
Memory:
    copy_bandwidth(device)           bytes per second of a large copy, read + write counted
    needed_bytes(B, N, V, dtype)     the fewest bytes a call must move (see its docstring)
"""

from __future__ import annotations

import platform
import statistics
import time

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# ----------------------------------------------------------------------------- device
def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def can_graph(device: torch.device) -> bool:
    """CUDA graphs exist only on CUDA devices."""
    return torch.device(device).type == "cuda"


def describe_device(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.machine()} x{torch.get_num_threads()} thread(s)"


def add_threads_option(parser) -> None:
    """The scripts' ``--threads``: CPU threads for torch, one by default."""
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for torch (default 1: stable figures on a shared machine)")


def use_threads(parser, threads: int, device: torch.device) -> None:
    """Apply ``--threads`` where the work runs on the CPU (a parser error below 1)."""
    if threads < 1:
        parser.error(f"--threads must be at least 1, got {threads}")
    if device.type == "cpu":
        torch.set_num_threads(threads)


def require_device(name: str) -> torch.device:
    """The device ``name`` names, or SystemExit with one line saying why it cannot be used."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"error: --device {name!r} is not a device name (expected cpu or cuda)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise SystemExit(f"error: --device {name} asked for, but torch {torch.__version__} ({build}) "
                         "sees no CUDA device; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"error: --device {name}: only cpu and cuda are supported")
    return device


# ----------------------------------------------------------------------------- timing
def time_eager(fn, count: int, device: torch.device, *, min_time: float = 0.2, min_reps: int = 3,
               max_reps: int = 200, warmup: int = 2) -> float:
    """Median seconds of one eager call ``fn(i)``, i rotating over ``range(count)`` so that no call
    reads the previous call's inputs from cache. Calls repeat until ``min_time`` seconds and
    ``min_reps`` calls are spent (at most ``max_reps``). On CUDA each call is timed with events (the
    launch gaps count: that is what an eager caller waits for); on CPU with ``perf_counter``."""
    device = torch.device(device)
    for i in range(warmup):  # first-call setup, compilation, autotuning
        fn(i % count)
    sync(device)
    times: list[float] = []
    while (sum(times) < min_time or len(times) < min_reps) and len(times) < max_reps:
        i = len(times) % count
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            start_s = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - start_s)
    return statistics.median(times)


def captured(call) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of ``call()``, after a first call on a side stream, as capture requires
    (compilation, allocator pools)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def time_graph(fn, count: int, device: torch.device, *, repeats: int = 20) -> float:
    """Median seconds per call of ``fn(i)`` under CUDA-graph replay: ``fn(0), ..., fn(count - 1)``
    are captured in one graph (so the inputs rotate), the graph is replayed ``repeats`` times, and
    each replay's time is divided by ``count``. ``fn`` must not synchronise with the host."""
    if not can_graph(device):
        raise ValueError(f"time_graph needs a CUDA device, got {device}")

    def calls():
        for i in range(count):
            fn(i)

    graph = captured(calls)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / count)
    del graph
    return statistics.median(times)


# ----------------------------------------------------------------------------- memory
def copy_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second of a ``megabytes`` MiB tensor copy on ``device``, its read and its write
    both counted; the best of ``repeats`` copies after one warm-up copy."""
    device = torch.device(device)
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(time_eager(lambda i: dst.copy_(src), 1, device, min_time=0.0, min_reps=1, max_reps=1,
                          warmup=0) for _ in range(repeats))
    return 2 * src.numel() * src.element_size() / best


def needed_bytes(batch: int, num_draft: int, vocab: int, dtype: torch.dtype, *,
                 output: torch.Tensor | None = None, id_bytes: int = 8) -> int:
    """The fewest bytes one call must move: per request the 2N scalars p_j[d_j] and q_j[d_j], the
    N draft ids, the N + 1 output ids, and the rows at the first rejected position e: p_e and q_e
    when a draft was rejected (the residual), p_N alone when every draft was accepted (the bonus).

    With ``output`` (the op's (B, N + 1) tokens, -1 after the emitted ones) each request's e is read
    from it; without, every request is counted as a rejection (two rows): the worst case."""
    elem = torch.finfo(dtype).bits // 8
    if output is None:
        rows = 2 * batch
    else:
        if tuple(output.shape) != (batch, num_draft + 1):
            raise ValueError(f"output has shape {tuple(output.shape)}, expected ({batch}, {num_draft + 1})")
        e = (output >= 0).sum(dim=1) - 1  # tokens emitted before the last one
        rows = batch + int((e < num_draft).sum())
    return (batch * (2 * num_draft * elem + num_draft * id_bytes + (num_draft + 1) * 4)
            + rows * vocab * elem)


# ----------------------------------------------------------------------------- inputs and baseline
def make_inputs(batch: int, num_draft: int, vocab: int, dtype: torch.dtype, device, gen: torch.Generator):
    """(draft, ids, target): target and draft rows that roughly agree (acceptance ~0.5-0.8), drafts
    sampled from the draft rows. Drawn on ``gen``'s device, then moved to ``device``."""
    gen_device = gen.device
    logits = torch.randn(batch, num_draft + 1, vocab, generator=gen, device=gen_device) * 3
    target = logits.softmax(-1)
    noise = torch.randn(batch, num_draft, vocab, generator=gen, device=gen_device)
    draft = (logits[:, :num_draft] + noise).softmax(-1)
    race = torch.empty_like(draft).exponential_(generator=gen)
    ids = (draft / race).argmax(-1)  # one sample of each draft row (exponential race)
    return draft.to(device, dtype), ids.to(device), target.to(device, dtype)


def eager_chain_sampling(draft: torch.Tensor, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The eager-torch baseline: vectorised, forms the residual at every position, then samples the
    row at the first rejection e by an exponential race (no host synchronisation, so it can be
    captured in a CUDA graph too). Returns the (B, N + 1) tokens, -1 after the emitted ones."""
    batch, num_draft = ids.shape
    rows_b = torch.arange(batch, device=target.device)
    p, q = target.float(), draft.float()
    p_d = p[:, :num_draft].gather(2, ids[..., None]).squeeze(2)
    q_d = q.gather(2, ids[..., None]).squeeze(2)
    rejected = torch.rand(batch, num_draft, device=p.device) * q_d >= p_d
    e = torch.where(rejected.any(1), rejected.int().argmax(1), num_draft)
    residual = torch.cat([(p[:, :num_draft] - q).clamp_min(0), p[:, num_draft:]], dim=1)
    rows = residual[rows_b, e]
    token = (rows / torch.empty_like(rows).exponential_()).argmax(-1)
    out = torch.where(torch.arange(num_draft + 1, device=p.device) < e[:, None],
                      torch.cat([ids, ids[:, :1]], dim=1), -1)
    out[rows_b, e] = token
    return out.int()
