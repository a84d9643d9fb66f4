"""End-to-end speculative decoding with specops: ``python -m specops.demo``

Builds two character-level n-gram models from the text shipped in specops/demo/corpus.txt: a
target (order 4, backed off to lower orders) and a weaker draft (order 3 by default). It decodes a
batch of sequences two ways (each step compiled and captured in a CUDA graph on a GPU; eager on a
CPU, where compiling these small steps makes them slower):

* speculative: the draft proposes N characters, the target scores all N + 1 positions in one call,
  and specops.chain_speculative_sampling_from_logits decides what to keep, from both models'
  logits and the sampling parameters (--temperature, --top-k, --top-p, --min-p);
* target-only: one target call per character.

With ``--tree WIDTHxDEPTH`` the speculative loop proposes a full tree instead (every node WIDTH
children, DEPTH levels; the children drawn from the draft model, with or without replacement, or
its top-k, verified target-only: ``--tree-children``), specops.tree_speculative_sampling verifies
it, and the chain of the same depth runs too, for comparison. The tree loop runs twice from the same
seed: with token verification (node by node from the root) and with traversal verification (from
the leaves, whole paths judged: docs/tree.md), each checked for losslessness. Traversal keeps more
when the children were drawn from the draft; with top-k children (target-only) the two rules are
one. The comparison is on the models'
probabilities as they are, so the sampling parameters keep their defaults with ``--tree``
(specops.tree_speculative_sampling_from_logits takes them; children drawn without replacement
from a truncated draft row would need more care than a demo gives them).

It prints characters per target call (the gain of speculative decoding, whatever a target call
costs) and a measured check of the lossless guarantee: the characters the speculative loop
generated must follow the target model's conditional distributions, processed by the sampling
parameters, as target-only samples do,
while draft-only samples (a control) must fail the same test. Then the time both loops took here.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import specops
from specops.core.logits.rule import processed_rows
from .progress import Progress
from .stats import chi2_pvalue

CORPUS = Path(__file__).with_name("corpus.txt")
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




# ----------------------------------------------------------------------------- sampling
@dataclass(frozen=True)
class Sampling:
    """A request's sampling parameters, the same for every sequence (docs/semantics.md,
    "Verification from logits")."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def processed(self, logits: torch.Tensor) -> torch.Tensor:
        """The distributions (..., V) these parameters make of logits (..., V): the rule the op
        applies, so that the drafts and the target-only samples follow it too."""
        flat = logits.reshape(-1, logits.shape[-1])
        rows = flat.shape[0]

        def each(value, dtype):
            return torch.full((rows,), value, dtype=dtype, device=logits.device)

        out = processed_rows(flat, each(self.temperature, torch.float32),
                             each(self.top_k, torch.int64), each(self.top_p, torch.float32),
                             each(self.min_p, torch.float32))
        return out.reshape(logits.shape)


# ----------------------------------------------------------------------------- decoding
def sample(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of (..., V) probabilities: exponential race (argmax p / Exp(1)).

    Traceable and CUDA-graph safe, unlike torch.multinomial's host-side checks.
    """
    exp = -torch.rand_like(probs).clamp_min(1e-30).log()
    return (probs / exp).argmax(dim=-1)


TREE_CHILDREN = ("sampled", "distinct", "top-k")


def children(q: torch.Tensor, width: int, how: str) -> torch.Tensor:
    """``width`` children tokens of every row of draft probabilities q (..., V): drawn i.i.d.
    ("sampled"), drawn without replacement ("distinct": the first arrivals of an exponential race
    come in the order of draws without replacement), or the top-k ("top-k")."""
    if how == "top-k":
        return q.topk(width, dim=-1).indices
    if how == "distinct":
        exp = -torch.rand_like(q).clamp_min(1e-30).log()
        return (q / exp).topk(width, dim=-1).indices
    return sample(q[..., None, :].expand(*q.shape[:-1], width, q.shape[-1]))


def full_tree_parents(width: int, depth: int, device) -> torch.Tensor:
    """(M,) parents of the full tree, nodes numbered level by level (siblings together, in the
    order they were drawn: the order the op tries them in)."""
    parents, first, count = [], 0, 1  # the level above: its first node and its size
    for _ in range(depth):
        parents += [first + k // width for k in range(count * width)]
        first, count = first + count, count * width
    return torch.tensor(parents, device=device)


def tree_nodes(width: int, depth: int) -> int:
    return sum(width**level for level in range(1, depth + 1))


class Decoder:
    """Static buffers plus the decode steps; every step updates the buffers in place."""

    def __init__(self, models: NgramModels, prompts: torch.Tensor, length: int, draft_len: int,
                 verification: str = "token", sampling: Sampling = Sampling(),
                 tree: tuple[int, int] | None = None, tree_children: str = "sampled",
                 greedy: bool = False):
        self.models = models
        self.sampling = sampling
        # Chains: "token" or "block" (docs/block.md); trees: "token" or "traversal" (docs/tree.md).
        self.verification = verification
        self.tree = tree  # (width, depth) for tree_step
        self.tree_children = tree_children
        self.greedy = greedy  # chain drafts: the draft's argmax, verified as one-hot drafts
        self.n = draft_len if tree is None else tree[1]
        draft_len = self.n
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
        if tree is not None:
            self.parents = full_tree_parents(*tree, device).expand(self.batch, -1)
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

    def _target_logits(self, chars: torch.Tensor) -> torch.Tensor:
        """Target logits (log-probabilities; -inf where a character never follows) after each
        window of 3 characters: (B, L) -> (B, L - 2, V)."""
        return rows(self.models.target, chars, TARGET_ORDER).log()

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
        chars, drafts, draft_logits = context, [], []
        for _ in range(self.n):  # the draft proposes N characters, one cheap call each
            logits = draft_row(self.models, chars).log()
            if self.greedy:  # one-hot drafts: the draft's argmax
                token = logits.argmax(dim=-1)
            else:
                token = sample(self.sampling.processed(logits))
            drafts.append(token)
            draft_logits.append(logits)
            chars = torch.cat([chars, token[:, None]], dim=1)
        draft_ids = torch.stack(drafts, dim=1)  # (B, N)
        target_logits = self._target_logits(chars)  # (B, N + 1, V): one target call
        # seed=None: the wrapper draws seed and offset with a device-side op, traced by
        # torch.compile and redrawn on every CUDA-graph replay (a Python int would be frozen).
        s = self.sampling
        output, _, _ = specops.chain_speculative_sampling_from_logits(
            None, draft_ids, target_logits, self.accepted, self.emitted,
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
            draft_logits=None if self.greedy else torch.stack(draft_logits, dim=1),
            verification=self.verification,
        )
        self._append(output.long(), (output >= 0).sum(dim=1))

    def tree_step(self) -> None:
        """The draft proposes a full tree, level by level (one cheap call per level); the target
        scores every node in one call; specops.tree_speculative_sampling keeps a path."""
        width, depth = self.tree
        chars = self._context()[:, None, :]  # (B, nodes of the level, path): the root
        levels, draft_rows, tokens = [chars], [], []
        for _ in range(depth):
            batch, count, length = chars.shape
            q = draft_row(self.models, chars.reshape(batch * count, length)).view(batch, count, -1)
            kids = children(q, width, self.tree_children).reshape(batch, count * width)
            chars = torch.cat([chars.repeat_interleave(width, dim=1), kids[:, :, None]], dim=2)
            levels.append(chars)
            draft_rows.append(q)
            tokens.append(kids)
        # Every node's rows, level by level as the nodes are numbered: one target call.
        last = [window_index(level[:, :, -CONTEXT:], self.models.vocab, CONTEXT)[..., 0]
                for level in levels]  # each node's last 3 characters, as a row index
        target_probs = self.models.target[torch.cat(last, dim=1)]  # (B, M + 1, V)
        draft_rows.append(torch.zeros_like(target_probs[:, : width**depth]))  # leaves: not read
        draft_probs = None if self.tree_children == "top-k" else torch.cat(draft_rows, dim=1)
        output, _, emitted = specops.tree_speculative_sampling(
            draft_probs, torch.cat(tokens, dim=1), self.parents, target_probs,
            with_replacement=self.tree_children == "sampled", verification=self.verification)
        output = output[:, : depth + 1].long()  # a path has at most depth drafts
        self._append(output, (output >= 0).sum(dim=1))
        self.emitted.add_(emitted)  # every row, as the chain op's counter counts

    def target_step(self) -> None:
        p = self.sampling.processed(self._target_logits(self._context())[:, 0])  # (B, V)
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
    characters: int
    p_value: float
    bin_shares: list[float]  # fraction of the characters in each of the BINS bins


BINS = 10


def fit_to_target(models: NgramModels, seq: torch.Tensor, start: int, seed: int,
                  sampling: Sampling = Sampling()) -> FitResult:
    """Do the generated characters follow the target's conditionals, processed by the sampling
    parameters? (probability integral transform)

    Each generated character x (columns ``start`` on of the CPU tensor ``seq``) is placed within the
    processed target row for its 3-character context, characters ordered from most to least likely:
    u = P(the characters more likely than x) + U * P(x), with U uniform on (0, 1). When every
    character is a draw from its row, every u is uniform on (0, 1) and independent of the u before
    it, so the u of all characters, whatever their contexts, fall evenly into BINS equal bins: the
    p-value is the chi-square test of that. A sampler that leaks the draft's preferences puts too
    many characters where the target puts little mass (u near 1).
    """
    v = models.vocab
    # (3-character context, next character) of every generated character, as one base-V number.
    pairs = window_index(seq, v, TARGET_ORDER)[:, start - CONTEXT :].reshape(-1)
    rows = sampling.processed(models.target[pairs // v].log()).double()  # (characters, V)
    x = (pairs % v)[:, None]
    p_x = rows.gather(1, x)
    token = torch.arange(v)[None, :]
    more_likely = (rows > p_x) | ((rows == p_x) & (token < x))  # ties: the lower id first
    u = (rows * more_likely).sum(1) + torch.rand(len(pairs), generator=torch.Generator().manual_seed(seed),
                                                 dtype=torch.float64) * p_x[:, 0]
    counts = torch.bincount((u * BINS).long().clamp(0, BINS - 1), minlength=BINS)
    return FitResult(len(pairs), chi2_pvalue(counts, torch.ones(BINS)),
                     (counts / max(len(pairs), 1)).tolist())


def draft_only_samples(models: NgramModels, prompts: torch.Tensor, length: int,
                       sampling: Sampling = Sampling()) -> torch.Tensor:
    """The control: sequences sampled from the draft model alone (they must fail the check)."""
    seq = prompts
    for _ in range(length):
        q = sampling.processed(draft_row(models, seq).log())
        seq = torch.cat([seq, sample(q)[:, None]], dim=1)
    return seq


# ----------------------------------------------------------------------------- main
def at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


MAX_TREE_NODES = 1023  # a full tree has WIDTH + WIDTH**2 + ... + WIDTH**DEPTH nodes


def tree_arg(text: str) -> tuple[int, int]:
    """WIDTHxDEPTH, two whole numbers >= 1, as (width, depth)."""
    width, _, depth = text.lower().partition("x")
    if not (width.isdigit() and depth.isdigit() and int(width) >= 1 and int(depth) >= 1):
        raise argparse.ArgumentTypeError(f"expected WIDTHxDEPTH, such as 2x4; got {text!r}")
    nodes = tree_nodes(int(width), int(depth))
    if nodes > MAX_TREE_NODES:
        raise argparse.ArgumentTypeError(
            f"{text} makes a tree of {nodes} nodes; at most {MAX_TREE_NODES}")
    return int(width), int(depth)


SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "min_p")


def parameter_arg(name: str, kind, low: float, high: float, low_open: bool = False):
    """An argparse type for a sampling parameter in [low, high] ((low, high] when low_open)."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value != value or value < low or value > high or (
                low_open and value == low):
            raise argparse.ArgumentTypeError(f"expected {name} in {interval}, got {text!r}")
        return value
    return parse


def device_arg(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected cpu or cuda, got {text!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda, got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "no CUDA device is visible" if torch.version.cuda else "this torch build has no CUDA support"
        raise argparse.ArgumentTypeError(f"CUDA is not available ({why}); use --device cpu")
    return device


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m specops.demo", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Speculative decoding of a batch of text with specops.chain_speculative_sampling: "
                    "characters per target call, a measured check that the output follows the target "
                    "model, and the time both decode loops take.")
    parser.add_argument("--device", type=device_arg, default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda")
    parser.add_argument("--draft-len", type=at_least_one, default=4, help="draft characters per step, N")
    parser.add_argument("--batch-size", type=at_least_one, default=128, help="sequences decoded together")
    parser.add_argument("--length", type=at_least_one, default=512, help="characters generated per sequence")
    parser.add_argument("--draft-order", type=int, default=3, choices=(1, 2, 3),
                        help="n-gram order of the draft model (the target's is 4)")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the whole run")
    parser.add_argument("--compile-backend", default="auto",
                        help="torch.compile backend for the decode steps (e.g. inductor, aot_eager); auto: "
                             "inductor plus a CUDA graph on cuda, no compiling on cpu, where compiled "
                             "steps this small run slower than eager ones")
    parser.add_argument("--verification", choices=("token", "block"), default="token",
                        help="judge each draft alone (token) or the drafts as a block (docs/block.md)")
    parser.add_argument("--tree", type=tree_arg, metavar="WIDTHxDEPTH",
                        help="propose a full tree (WIDTH children per node, DEPTH levels) and "
                             "verify it with specops.tree_speculative_sampling, with token and "
                             "with traversal verification, beside the chain of N = DEPTH drafts "
                             "(--draft-len does not apply; the sampling parameters keep their "
                             "defaults)")
    parser.add_argument("--tree-children", choices=TREE_CHILDREN, default="sampled",
                        help="a tree's children: drawn from the draft model i.i.d. (sampled) or "
                             "without replacement (distinct), both verified with the draft "
                             "probabilities; or its top-k, verified target-only (the chain then "
                             "has greedy drafts)")
    parser.add_argument("--no-compile", action="store_true", help="run the steps eagerly on any device")
    parser.add_argument("--temperature", type=parameter_arg("a number", float, 0, float("inf")),
                        default=1.0, help="sampling temperature; 0 is greedy decoding")
    parser.add_argument("--top-k", type=parameter_arg("a whole number", int, 0, float("inf")),
                        default=0, help="keep the k most likely characters; 0 is off")
    parser.add_argument("--top-p", type=parameter_arg("a number", float, 0, 1, low_open=True),
                        default=1.0, help="keep the most likely characters of mass >= top-p; 1 is off")
    parser.add_argument("--min-p", type=parameter_arg("a number", float, 0, 1), default=0.0,
                        help="keep the characters of probability >= min-p times the largest; 0 is off")
    args = parser.parse_args(argv)
    # The tree comparison runs on the models' probabilities as they are (module docstring).
    given = [f"--{name.replace('_', '-')}" for name in SAMPLING_FLAGS
             if getattr(args, name) != parser.get_default(name)]
    if args.tree is not None and given:
        parser.error(f"--tree verifies the models' probabilities as they are; sampling "
                     f"parameters ({', '.join(given)}) are for chains only")
    return args


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = args.device
    torch.manual_seed(args.seed)
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny tensors: threads cost more than they give, worse on a busy CPU
    backend = args.compile_backend
    if args.no_compile or (backend == "auto" and device.type == "cpu"):
        backend = None
    elif backend == "auto":
        backend = "inductor"

    start = time.perf_counter()
    text = CORPUS.read_text()
    models = build_models(text, args.draft_order).to(device)
    print(f"specops {specops.__version__} demo on {device} | torch {torch.__version__} | "
          f"compile: {backend or 'off'}{' + CUDA graph' if device.type == 'cuda' else ''}")
    print(f"models: order-4 target and order-{args.draft_order} draft over {models.vocab} characters, "
          f"built from {len(text):,} characters of {CORPUS.name} in {time.perf_counter() - start:.2f}s")

    # Prompts: snippets of the corpus at random places.
    prompt_len = 8
    starts = torch.randint(0, len(text) - prompt_len, (args.batch_size,)).tolist()
    prompts = torch.tensor([models.encode(text[s : s + prompt_len]) for s in starts], device=device)
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.min_p)
    decoder = Decoder(models, prompts, args.length, args.draft_len,
                      args.verification if args.tree is None else "token", sampling,
                      tree=args.tree, tree_children=args.tree_children)
    draft_len = decoder.n
    check_every = 8 if device.type == "cuda" else 1

    step = decoder.speculative_step if args.tree is None else decoder.tree_step
    spec_run, spec_setup_s = make_runner(step, decoder, device, backend)
    if args.tree is not None:
        torch.manual_seed(args.seed)  # the traversal loop below starts from this state too
    spec_s, spec_steps = decode(spec_run, decoder, "speculative", check_every)
    spec_tokens = decoder.tokens[:, : decoder.end].clone()
    spec_calls = int(decoder.calls.sum())
    accepted, emitted = int(decoder.accepted.sum()), int(decoder.emitted.sum())
    generated = args.batch_size * args.length
    chain_per_call = traversal_per_call = traversal_tokens = None
    if args.tree is not None:
        # The same tree loop with traversal verification: the same models, trees drawn from the
        # same random state, so the two rules differ only in what they keep.
        traversal = Decoder(models, prompts, args.length, draft_len, "traversal", sampling,
                            tree=args.tree, tree_children=args.tree_children)
        traversal_run, _ = make_runner(traversal.tree_step, traversal, device, backend)
        torch.manual_seed(args.seed)
        decode(traversal_run, traversal, "traversal", check_every)
        traversal_tokens = traversal.tokens[:, : traversal.end].clone()
        traversal_per_call = generated / int(traversal.calls.sum())
        # The chain of the same depth, for comparison.
        chain = Decoder(models, prompts, args.length, draft_len, args.verification, sampling,
                        greedy=args.tree_children == "top-k")
        chain_run, _ = make_runner(chain.speculative_step, chain, device, backend)
        decode(chain_run, chain, "chain", check_every)
        chain_per_call = generated / int(chain.calls.sum())

    target_run, target_setup_s = make_runner(decoder.target_step, decoder, device, backend)
    target_s, target_steps = decode(target_run, decoder, "target-only", check_every)
    target_tokens = decoder.tokens[:, : decoder.end].clone()

    # The lossless check, on the CPU.
    cpu_models = models.to("cpu")
    control = draft_only_samples(cpu_models, prompts.cpu(), args.length, sampling)
    checked = [("speculative (specops)", spec_tokens)]
    if traversal_tokens is not None:
        checked.append(("traversal (specops)", traversal_tokens))
    results = {name: fit_to_target(cpu_models, seq.cpu(), prompt_len, args.seed, sampling)
               for name, seq in (*checked, ("target-only", target_tokens),
                                 ("draft-only (control)", control))}
    ctrl = results["draft-only (control)"]
    lossless = all(results[name].p_value > 1e-3 for name, _ in checked) and ctrl.p_value < 1e-3
    if not ctrl.p_value < 1e-3:
        verdict = ("TOO FEW CHARACTERS to tell the draft-only control from the target; "
                   "raise --batch-size or --length")
    elif lossless:
        verdict = "PASS: the speculative output follows the target model; the draft-only control does not"
    else:
        verdict = "FAIL: the speculative output deviates from the target model"

    per_call = generated / spec_calls  # a finished sequence's steps do not count against it
    judged = spec_steps * args.batch_size * draft_len  # every row is judged at every step
    kept_per_step = emitted / (spec_steps * args.batch_size)
    passed = accepted / judged if args.tree is None else None  # the tree op has no such counter
    prompt = models.decode(spec_tokens[0, :prompt_len].tolist())
    continuation = models.decode(spec_tokens[0, prompt_len : prompt_len + 72].tolist())
    print(f"\nsample, prompt + generated: {prompt!r} + {continuation!r}")
    if args.tree is None:
        print(f"\n{plural(args.batch_size, 'sequence')} x {plural(args.length, 'character')}, "
              f"N = {args.draft_len} draft characters per step; temperature {args.temperature:g}, "
              f"top-k {args.top_k}, top-p {args.top_p:g}, min-p {args.min_p:g}")
        print(f"  characters per target call   {per_call:.2f}  "
              f"(target-only: 1; {args.verification} verification)")
    else:
        width, depth = args.tree
        print(f"\n{plural(args.batch_size, 'sequence')} x {plural(args.length, 'character')}, "
              f"a full tree of {width}x{depth} ({tree_nodes(width, depth)} draft characters, "
              f"{args.tree_children} children) per step")
        target_only = args.tree_children == "top-k"
        print(f"  characters per target call   {per_call:.2f}  (target-only: 1; token verification of "
              f"the tree{', target-only' if target_only else ''})")
        gain = traversal_per_call / per_call - 1
        why = ("the token rule's own, with no draft probabilities" if target_only
               else "whole paths judged from the leaves")
        print(f"  with traversal verification  {traversal_per_call:.2f}  ({gain:+.1%}: {why})")
        drafts = "greedy drafts" if args.tree_children == "top-k" else "sampled drafts"
        print(f"  the chain of the same depth  {chain_per_call:.2f}  (N = {depth} {drafts}, "
              f"{args.verification} verification)")
    print(f"  lossless check               {verdict}")
    print(f"  drafts kept per step         {kept_per_step:.2f} of {draft_len}  "
          f"(the accepted {'prefix' if args.tree is None else 'path'}; each step adds one more "
          f"character)")
    if passed is not None and args.temperature == 0:  # greedy: no coins, a draft is kept or not
        print(f"  drafts equal to the target's {passed:.1%}  (most likely character, every "
              f"position judged alone, also after\n{'':32s}a rejection: the op's accepted counter "
              f"over all drafts judged)")
    elif passed is not None:
        print(f"  drafts accepted by own coin  {passed:.1%}  (every position judged alone, also "
              f"after a rejection:\n{'':32s}the op's accepted counter over all drafts judged)")
    print(f"\nlossless check: where each generated character falls in the target's distribution for "
          f"its context\n(most likely characters first), in {BINS} bins that hold {1 / BINS:.0%} each "
          f"when the characters follow the target")
    print(f"  {'sampler':22s} {'characters':>10s} {'p-value':>8s}  share of each bin")
    for name, r in results.items():
        shares = " ".join(f"{100 * s:3.0f}" for s in r.bin_shares)
        print(f"  {name:22s} {r.characters:10,d} {r.p_value:8.4f}  {shares}")
    print("  (chi-square test of even bins; PASS needs p > 0.001 for specops and p < 0.001 for the control)")

    spec_step_s, target_step_s = spec_s / spec_steps, target_s / target_steps
    setup = "compile and warm-up" if backend else "warm-up"
    print(f"\ntime on this {device.type}, where a target call (an n-gram table look-up) costs next to "
          f"nothing:")
    print(f"  speculative   {plural(spec_steps, 'step'):>12s} of {spec_step_s * 1e3:6.2f} ms "
          f"{generated / spec_s:12,.0f} characters/s  ({setup} {spec_setup_s:.1f}s)")
    print(f"  target-only   {plural(target_steps, 'step'):>12s} of {target_step_s * 1e3:6.2f} ms "
          f"{generated / target_s:12,.0f} characters/s  ({setup} {target_setup_s:.1f}s)")
    speedup = target_s / spec_s
    print(f"  speculative throughput / target-only throughput: {speedup:.2f}x")
    # A step costs (its own work + a target call): with a target call costing X more seconds, the
    # speculative loop wins when (spec_step + X) / per_call < target_step + X.
    if per_call > 1 and spec_step_s > per_call * target_step_s:
        break_even = (spec_step_s - per_call * target_step_s) / (per_call - 1)
        print(f"  a speculative step does more (the draft calls and the op); it pays off once a "
              f"target call\n"
              f"  costs {break_even * 1e3:.2f} ms more, as a neural model's forward pass does, and the "
              f"ratio tends to {per_call:.2f}x as that cost grows")
    print(f"\ntotal time {time.perf_counter() - start:.1f}s")
    return {"lossless": lossless, "results": results, "passed_own_test": passed,
            "kept_per_step": kept_per_step, "characters_per_call": per_call, "speedup": speedup,
            "chain_characters_per_call": chain_per_call,
            "traversal_characters_per_call": traversal_per_call}

