"""End-to-end speculative decoding with specops: ``python -m specops.demo``.

Builds two character-level n-gram models from the text shipped in ``specops/data/corpus.txt``: a
target (order 4, backed off to lower orders) and a weaker draft (order 3 by default). It decodes a
batch of sequences two ways, each step inside ``torch.compile`` (and a CUDA graph on a GPU):

* speculative: the draft proposes N characters, the target scores all N + 1 positions in one call,
  and ``specops.chain_speculative_sampling`` decides what to keep;
* target-only: one target call per character.

It prints the acceptance rate, characters per target call, the throughput of both loops, and a
measured check of the lossless guarantee: the characters the speculative loop generated must follow
the target model's conditional distributions as well as target-only samples do (pooled chi-square
over contexts), while draft-only samples (a control) must fail the same test.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import specops
from specops.progress import Progress

CORPUS = Path(__file__).with_name("data") / "corpus.txt"
TARGET_ORDER = 4  # the target looks at the last 3 characters
CONTEXT = TARGET_ORDER - 1


# ----------------------------------------------------------------------------- models
@dataclass
class NgramModels:
    """Character n-gram models as dense tables: row c1*V**(k-2) + ... + c_{k-1} of an order-k
    table is P(next | the last k - 1 characters c1 .. c_{k-1})."""

    alphabet: str
    target: torch.Tensor  # (V**3, V): order TARGET_ORDER
    draft: torch.Tensor  # (V**(draft_order - 1), V)
    draft_order: int

    @property
    def vocab(self) -> int:
        return len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        return [self.alphabet.index(ch) for ch in text]

    def decode(self, ids) -> str:
        return "".join(self.alphabet[i] for i in ids)

    def to(self, device) -> "NgramModels":
        return NgramModels(self.alphabet, self.target.to(device), self.draft.to(device), self.draft_order)


def window_index(chars: torch.Tensor, vocab: int, width: int) -> torch.Tensor:
    """Base-V number of every window of ``width`` consecutive characters along the last dim."""
    count = chars.shape[-1] - width + 1
    index = torch.zeros_like(chars[..., :count])
    for k in range(width):
        index = index * vocab + chars[..., k : k + count]
    return index


def rows(table: torch.Tensor, chars: torch.Tensor, order: int) -> torch.Tensor:
    """Probabilities after every window of order - 1 characters: (B, L) -> (B, L - order + 2, V)."""
    return table[window_index(chars, table.shape[1], order - 1)]


def draft_row(models: "NgramModels", chars: torch.Tensor) -> torch.Tensor:
    """Draft probabilities after the last characters of (B, L) chars: (B, V)."""
    order = models.draft_order
    return rows(models.draft, chars[:, -max(order - 1, 1) :], order)[:, -1]


def build_models(text: str, draft_order: int = 3) -> NgramModels:
    alphabet = "".join(sorted(set(text)))
    vocab = len(alphabet)
    ids = torch.tensor([alphabet.index(ch) for ch in text], dtype=torch.long)

    # Maximum-likelihood conditionals of orders 1 .. 4; an order-k context never seen takes the
    # order-(k-1) row of its last k - 2 characters. The add-one unigram keeps every row positive.
    tables = [((torch.bincount(ids, minlength=vocab).double() + 1) / (len(ids) + vocab))[None, :]]
    for order in range(2, TARGET_ORDER + 1):
        counts = torch.bincount(window_index(ids, vocab, order), minlength=vocab**order)
        counts = counts.double().view(-1, vocab)
        totals = counts.sum(-1, keepdim=True)
        lower = tables[-1].repeat(vocab, 1)  # row r of the order-k table -> row r mod V**(k-2)
        tables.append(torch.where(totals > 0, counts / totals.clamp_min(1), lower))

    def expand(table: torch.Tensor, order: int) -> torch.Tensor:  # as an order-TARGET_ORDER table
        return table.repeat(vocab ** (TARGET_ORDER - order), 1)

    # Interpolation keeps every character possible in every context while order 4 dominates.
    weights = {4: 0.90, 3: 0.07, 2: 0.02, 1: 0.01}
    target = sum(w * expand(tables[k - 1], k) for k, w in weights.items())
    draft = 0.97 * tables[draft_order - 1] + 0.03 * tables[0]
    return NgramModels(alphabet, target.float().contiguous(), draft.float().contiguous(), draft_order)




# ----------------------------------------------------------------------------- decoding
def sample(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of (..., V) probabilities: exponential race (argmax p / Exp(1)).

    Traceable and CUDA-graph safe, unlike torch.multinomial's host-side checks.
    """
    exp = -torch.rand_like(probs).clamp_min(1e-30).log()
    return (probs / exp).argmax(dim=-1)


class Decoder:
    """Static buffers plus the two decode steps; every step updates the buffers in place."""

    def __init__(self, models: NgramModels, prompts: torch.Tensor, length: int, draft_len: int):
        self.models = models
        self.n = draft_len
        self.batch = prompts.shape[0]
        self.prompt_len = prompts.shape[1]
        self.end = self.prompt_len + length  # stop once every sequence has this many characters
        device = prompts.device
        self.prompts = prompts
        self.tokens = torch.zeros(self.batch, self.end + draft_len + 1, dtype=torch.long, device=device)
        self.lengths = torch.zeros(self.batch, dtype=torch.long, device=device)
        self.accepted = torch.zeros(self.batch, dtype=torch.int64, device=device)
        self.emitted = torch.zeros(self.batch, dtype=torch.int64, device=device)
        self.calls = torch.zeros(self.batch, dtype=torch.int64, device=device)  # while unfinished
        self.reset()

    def reset(self) -> None:
        self.tokens.zero_()
        self.tokens[:, : self.prompt_len] = self.prompts
        self.lengths.fill_(self.prompt_len)
        for counter in (self.accepted, self.emitted, self.calls):
            counter.zero_()

    def _context(self) -> torch.Tensor:
        """(B, 3): the last three characters of every sequence."""
        index = self.lengths[:, None] - CONTEXT + torch.arange(CONTEXT, device=self.lengths.device)
        return self.tokens.gather(1, index)

    def _target_rows(self, chars: torch.Tensor) -> torch.Tensor:
        """Target probabilities after each window of 3 characters: (B, L) -> (B, L - 2, V)."""
        return rows(self.models.target, chars, TARGET_ORDER)

    def _append(self, new: torch.Tensor, count: torch.Tensor) -> None:
        """Write the first count[b] tokens of new[b] after each sequence; finished ones stay put."""
        active = self.lengths < self.end
        count = torch.where(active, count, 0)
        positions = self.lengths[:, None] + torch.arange(new.shape[1], device=new.device)
        positions = positions.clamp(max=self.tokens.shape[1] - 1)  # finished rows may be past it
        keep = torch.arange(new.shape[1], device=new.device)[None, :] < count[:, None]
        old = self.tokens.gather(1, positions)
        self.tokens.scatter_(1, positions, torch.where(keep, new, old))
        self.lengths.add_(count)
        self.calls.add_(active.long())

    def speculative_step(self) -> None:
        context = self._context()
        chars, drafts, draft_rows = context, [], []
        for _ in range(self.n):  # the draft proposes N characters, one cheap call each
            q = draft_row(self.models, chars)
            token = sample(q)
            drafts.append(token)
            draft_rows.append(q)
            chars = torch.cat([chars, token[:, None]], dim=1)
        draft_ids = torch.stack(drafts, dim=1)  # (B, N)
        draft_probs = torch.stack(draft_rows, dim=1)  # (B, N, V)
        target_probs = self._target_rows(chars)  # (B, N + 1, V): one target call
        # seed=None: the wrapper draws seed and offset with a device-side op, traced by
        # torch.compile and redrawn on every CUDA-graph replay (a Python int would be frozen).
        output, _, _ = specops.chain_speculative_sampling(
            draft_probs, draft_ids, target_probs, self.accepted, self.emitted
        )
        self._append(output.long(), (output >= 0).sum(dim=1))

    def target_step(self) -> None:
        p = self._target_rows(self._context())[:, 0]  # (B, V)
        self._append(sample(p)[:, None], torch.ones_like(self.lengths))


def make_runner(step, decoder: Decoder, device: torch.device, compile_backend: str | None):
    """Compile ``step`` (and capture it in a CUDA graph on a GPU); returns (run, seconds spent)."""
    start = time.perf_counter()
    if compile_backend:
        step = torch.compile(step, backend=compile_backend, fullgraph=True)
    run = step
    if device.type == "cuda":
        # Warm up (compile, autotune) on a side stream, as CUDA-graph capture requires.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay  # replays read and write the decoder's static buffers
    else:
        for _ in range(2):  # warm-up: triggers compilation
            step()
    decoder.reset()
    _sync(device)
    return run, time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode(run, decoder: Decoder, label: str, check_every: int) -> tuple[float, int]:
    """Run steps until every sequence is complete; returns (seconds taken, steps run)."""
    target = decoder.batch * (decoder.end - decoder.prompt_len)
    start, steps = time.perf_counter(), 0
    with Progress(target, label) as bar:
        while True:
            for _ in range(check_every):  # check for completion (a host sync) only now and then
                run()
            steps += check_every
            done = int((decoder.lengths.clamp(max=decoder.end) - decoder.prompt_len).sum())
            bar.update(done)
            if done >= target:
                break
    return time.perf_counter() - start, steps


# ----------------------------------------------------------------------------- lossless check
@dataclass
class FitResult:
    tokens: int
    contexts: int
    chi2: float
    dof: int
    p_value: float
    mean_tv: float


def fit_to_target(models: NgramModels, seq: torch.Tensor, start: int, min_count: int) -> FitResult:
    """Pooled Pearson chi-square of generated characters against the target's conditionals.

    Given its 3-character context, every generated character (columns ``start`` on of the CPU
    tensor ``seq``) should be an independent draw from the target's row for that context. Contexts
    seen at least ``min_count`` times are tested; in each, characters expected fewer than 5 times
    are pooled into one bin. Returns the statistic, its p-value and the count-weighted mean total
    variation distance between empirical and target rows (which shrinks with more samples).
    """
    v = models.vocab
    # (3-character context, next character) of every generated character, as one base-V number.
    pairs = window_index(seq, v, TARGET_ORDER)[:, start - CONTEXT :]
    observed = torch.bincount(pairs.reshape(-1), minlength=v**TARGET_ORDER).view(-1, v).double()
    totals = observed.sum(1)
    chi2, dof, tv_sum, tested = 0.0, 0, 0.0, 0
    for ctx in torch.nonzero(totals >= min_count).flatten().tolist():
        n = totals[ctx]
        expected = n * models.target[ctx].double()
        big = expected >= 5
        obs_bins = torch.cat([observed[ctx][big], observed[ctx][~big].sum().reshape(1)])
        exp_bins = torch.cat([expected[big], expected[~big].sum().reshape(1)])
        if exp_bins[-1] < 5 and len(exp_bins) > 2:  # too small to stand alone: merge it
            obs_bins = torch.cat([obs_bins[:-2], obs_bins[-2:].sum().reshape(1)])
            exp_bins = torch.cat([exp_bins[:-2], exp_bins[-2:].sum().reshape(1)])
        if len(exp_bins) < 2:
            continue
        chi2 += float(((obs_bins - exp_bins) ** 2 / exp_bins).sum())
        dof += len(exp_bins) - 1
        tv_sum += 0.5 * float((observed[ctx] / n - models.target[ctx].double()).abs().sum()) * float(n)
        tested += int(n)
    # Upper tail of the chi-square distribution: Q(dof / 2, chi2 / 2).
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(chi2 / 2))) if dof else math.nan
    contexts = int((totals >= min_count).sum())
    return FitResult(int(totals.sum()), contexts, chi2, dof, p_value, tv_sum / max(tested, 1))


def draft_only_samples(models: NgramModels, prompts: torch.Tensor, length: int) -> torch.Tensor:
    """The control: sequences sampled from the draft model alone (they must fail the check)."""
    seq = prompts
    for _ in range(length):
        q = draft_row(models, seq)
        seq = torch.cat([seq, sample(q)[:, None]], dim=1)
    return seq


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specops.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--draft-len", type=int, default=4, help="draft tokens per step, N (default 4)")
    parser.add_argument("--batch-size", type=int, default=128, help="sequences decoded together")
    parser.add_argument("--length", type=int, default=512, help="characters generated per sequence")
    parser.add_argument("--draft-order", type=int, default=3, choices=(1, 2, 3),
                        help="n-gram order of the draft model (default 3; the target's is 4)")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the whole run")
    parser.add_argument("--no-compile", action="store_true", help="run the steps eagerly")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend (default: inductor on cuda, aot_eager on cpu, "
                             "where inductor's C++ build takes longer than the demo itself)")
    args = parser.parse_args(argv)
    if args.draft_len < 1 or args.batch_size < 1 or args.length < 1:
        parser.error("--draft-len, --batch-size and --length must be at least 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny tensors: threads cost more than they give, worse on a busy CPU
    backend = None if args.no_compile else (
        args.compile_backend or ("inductor" if device.type == "cuda" else "aot_eager"))

    start = time.perf_counter()
    text = CORPUS.read_text()
    models = build_models(text, args.draft_order).to(device)
    print(f"specops {specops.__version__} demo on {device} | torch {torch.__version__} | "
          f"compile: {backend or 'off'}{' + CUDA graph' if device.type == 'cuda' else ''}")
    print(f"models: order-4 target and order-{args.draft_order} draft over {models.vocab} characters, "
          f"built from {len(text):,} characters of {CORPUS.name} in {time.perf_counter() - start:.2f}s")

    # Prompts: 8-character snippets of the corpus at random places.
    starts = torch.randint(0, len(text) - 8, (args.batch_size,)).tolist()
    prompts = torch.tensor([models.encode(text[s : s + 8]) for s in starts], device=device)
    decoder = Decoder(models, prompts, args.length, args.draft_len)
    check_every = 8 if device.type == "cuda" else 1

    spec_run, spec_compile_s = make_runner(decoder.speculative_step, decoder, device, backend)
    spec_s, spec_steps = decode(spec_run, decoder, "speculative", check_every)
    spec_tokens = decoder.tokens[:, : decoder.end].clone()
    spec_calls = int(decoder.calls.sum())
    accepted, emitted = int(decoder.accepted.sum()), int(decoder.emitted.sum())

    target_run, target_compile_s = make_runner(decoder.target_step, decoder, device, backend)
    target_s, target_steps = decode(target_run, decoder, "target-only", check_every)
    target_tokens = decoder.tokens[:, : decoder.end].clone()

    generated = args.batch_size * args.length
    judged = spec_steps * args.batch_size * args.draft_len  # every row is judged at every step
    acceptance = accepted / judged
    per_call = generated / spec_calls  # a finished sequence's steps do not count against it
    spec_step_s, target_step_s = spec_s / spec_steps, target_s / target_steps
    print(f"\nsample: {models.decode(spec_tokens[0, : 80].tolist())!r}")
    print(f"\n{args.batch_size} sequences x {args.length} characters, draft length N = {args.draft_len}")
    print(f"  acceptance rate          {acceptance:.3f} of draft positions (each judged by its own coin)")
    print(f"  characters / target call {per_call:.2f} (target-only: 1); "
          f"{emitted / judged * args.draft_len:.2f} drafts kept per step")
    print(f"  speculative              {generated / spec_s:10,.0f} characters/s, {spec_steps} steps of "
          f"{spec_step_s * 1e3:.2f} ms (compile and warm-up {spec_compile_s:.1f}s)")
    print(f"  target-only              {generated / target_s:10,.0f} characters/s, {target_steps} steps of "
          f"{target_step_s * 1e3:.2f} ms (compile and warm-up {target_compile_s:.1f}s)")
    print(f"  speed-up                 {target_s / spec_s:.3g}x")
    # A step costs (its own work + a target call): with a target call costing X more seconds, the
    # speculative loop wins when (spec_step + X) / per_call < target_step + X.
    if per_call > 1 and spec_step_s > per_call * target_step_s:
        break_even = (spec_step_s - per_call * target_step_s) / (per_call - 1)
        print(f"  (n-gram calls cost next to nothing; once a target call costs {break_even * 1e3:.2f} ms "
              f"more, as a neural\n   model's forward pass does, the speculative loop wins, up to "
              f"{per_call:.2f}x)")

    start_col = decoder.prompt_len
    cpu_models = models.to("cpu")
    control = draft_only_samples(cpu_models, prompts.cpu(), args.length)
    min_count = 30
    results = {
        name: fit_to_target(cpu_models, seq.cpu(), start_col, min_count)
        for name, seq in (("speculative (specops)", spec_tokens), ("target-only", target_tokens),
                          ("draft-only (control)", control))
    }
    print(f"\nlossless check: generated characters vs the target model's P(next | 3 characters),"
          f"\npooled chi-square over contexts seen >= {min_count} times")
    print(f"  {'sampler':24s} {'chars':>7s} {'contexts':>8s} {'chi2/dof':>9s} {'p-value':>8s} {'mean TV':>8s}")
    for name, r in results.items():
        print(f"  {name:24s} {r.tokens:7d} {r.contexts:8d} {r.chi2 / max(r.dof, 1):9.3f} "
              f"{r.p_value:8.4f} {r.mean_tv:8.4f}")
    spec, ctrl = results["speculative (specops)"], results["draft-only (control)"]
    lossless = spec.p_value > 1e-3 and ctrl.p_value < 1e-3
    if spec.dof == 0 or not ctrl.p_value < 1e-3:
        verdict = ("TOO FEW CHARACTERS: the test cannot yet tell the draft-only control from the "
                   "target; raise --batch-size or --length")
    elif lossless:
        verdict = ("PASS: speculative output follows the target distribution (p > 0.001) and the "
                   "test rejects the draft-only control (p < 0.001)")
    else:
        verdict = "FAIL: the speculative output deviates from the target distribution (p <= 0.001)"
    print(f"  {verdict}")
    print(f"\ntotal time {time.perf_counter() - start:.1f}s")
    return {"lossless": lossless, "results": results, "acceptance": acceptance,
            "characters_per_call": per_call, "speedup": target_s / spec_s}


if __name__ == "__main__":
    main()
