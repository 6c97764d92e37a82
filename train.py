"""Train a sentence encoder with the margin loss and mega-batch hard negatives (Wieting et al., eq. 1-2).

    paraphrastic-train --train-file pairs.tsv.gz --output-dir runs/sp [--mode paraphrase|bitext] ...
    paraphrastic-train --train-shards shards/ --sp-model sp.model --output-dir runs/sp ...
    paraphrastic-train --train-file pairs.tsv.gz --model word,trigram --combine concat --output-dir runs/wt

The encoder is SP by default; --model picks the seed papers' others (word, trigram, lstm, blstm, and
sums or concatenations of several); they share the table, the optimizer and the checkpoint format.

For a pair (s, t) the loss is [delta - cos(g(s), g(t)) + cos(g(s), g(t'))]_+, where t' is the most
similar sentence of the mega-batch under the current parameters that is neither t, nor a copy of s or
t, nor a sentence whose own partner is a copy of s (a known paraphrase). By default the loss is
symmetric (the same term for t with a negative s'); `--one-sided` is eq. 1 exactly. With bitext the
negatives of an English sentence come only from the other language and vice versa.

Data: a TSV of raw pairs (tokenized once into memory) or HDF5 shards (read one window at a time, so
RAM does not grow with the corpus); both feed the same seeded sampler. `output-dir` receives
`model.pt` (inference checkpoint), `best.pt` (best by dev Pearson, with --dev-file), `resume.pt`
(training state for --resume) and `metrics.jsonl`, all written atomically.

On caption paraphrases keep --megabatch-size small: with a large mega-batch the hardest "negative" is
usually a caption of a near-identical image and training collapses (M >= 40; in short runs on the
Multi30k captions M = 1 was best and M = 4 already degraded).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from paraphrastic import distributed, evaluate
from paraphrastic.distributed import ALONE, Ranks
from paraphrastic.encoders import TOKENIZERS, bag_owners, build_vocab
from paraphrastic.fileio import (
    Error,
    InputError,
    at_least,
    atomic_output,
    cli_parser,
    device_name,
    file_digest,
    iter_line_chunks,
    lock_folder,
    open_input,
    refuse_same_file,
    remove_stale_temps,
    reporting_full_disk,
    run_cli,
)
from paraphrastic.models import (
    TRAIN_STATE,
    Bags,
    Model,
    SPModel,
    Tokenizer,
    from_checkpoint,
    load_model,
    native_bf16,
    read_sp_model,
    resolve_device,
    train_sentencepiece,
)
from paraphrastic.pairs import PairData, PairSampler, ShardSet, iter_pairs, shard_paths, take_bags, tokenize_pairs
from paraphrastic.static import model_path
from paraphrastic.workers import use_threads

STATE_FORMAT = TRAIN_STATE
STATE_VERSION = 2
SP_SENTENCES = 2_000_000  # distinct sentences a new sentencepiece model is trained on
MINE_CHUNK = 2048  # rows per similarity block when mining (measured best of 2048-6400)
MAX_LISTED_COPIES = 64  # copies of one sentence in a mega-batch past which forbidden pairs are not listed
SYNC_FREE_ON_CPU = False  # tests set it to run the GPU's step (no waits on the device) on a CPU
EMBED_CHUNK = 8192  # sentences embedded at once when mining (bounds an LSTM's padded batch)
STRUCTURE = ("encoder", "lowercase", "parts", "combine")  # the config keys that say what a model is
SP_INPUT = "sentencepiece-input.txt"  # temporary text a new sentencepiece model is trained on
PATH_ARGS = ("train_file", "train_shards", "output_dir", "sp_model", "init_from", "distill", "relate", "dev_file")
OUTPUTS = ("model.pt", "best.pt", "resume.pt", "sp.model", SP_INPUT)  # names whose stale temporaries are removed
# Arguments that must not change on --resume (the others, e.g. --max-steps, may).
FIXED_ON_RESUME = (
    "mode", "dim", "batch_size", "megabatch_size", "megabatch_anneal", "lr", "delta", "dropout",
    "grad_clip", "one_sided", "seed", "mine_precision", "distill_weight", "distill_batch_size",
    "distill_relational", "distill_contrastive", "distill_temperature", "distill_neighbours", "distill_pool",
    "distill_soft", "relate_weight", "margin_weight", "model", "combine", "scramble_rate", "max_types",
)  # fmt: skip
LATER_SETTINGS = {
    "distill_relational": 0.0,
    "distill_contrastive": 0.0,
    "distill_temperature": 0.1,
    "distill_neighbours": 0,
    "distill_pool": 4096,
    "distill_soft": 0.0,
    "relate": None,
    "relate_weight": 1.0,
}  # settings newer than some saved runs: their value in those runs
# Inputs that must be the same files on --resume (unless --force-resume): paths compared as absolute paths.
INPUTS_ON_RESUME = ("train_file", "train_shards", "distill", "relate", "lowercase", "sp_model", "init_from")
# The parts of a training state that resuming reads, with their types.
STATE_PARTS = {
    "args": dict,
    "model": dict,
    "optimizer": dict,
    "position": dict,
    "num_pairs": int,
    "torch_rng": torch.Tensor,
}
START_OVER = "move it away to start the run over, or restore a copy"


# ----------------------------------------------------------------------------- sentencepiece


def sentencepiece_from_text(
    path: Path, vocab_size: int, lowercase: bool, skip_bad: bool, threads: int, workdir: Path
) -> bytes:
    """Train the sentencepiece model on the distinct sentences of both sides (at most SP_SENTENCES)."""
    seen: set[int] = set()
    fd, name = tempfile.mkstemp(dir=workdir, prefix=f".{SP_INPUT}.{os.getpid()}.", suffix=".tmp")  # stale: removable
    tmp = Path(name)
    try:
        with open(fd, "w", encoding="utf-8") as f, reporting_full_disk(workdir / SP_INPUT):
            for src, tgt in iter_pairs(path, skip_bad):
                text = "\n".join(itertools.chain(src, tgt))
                fresh = [s for s in (text.lower() if lowercase else text).split("\n") if s and hash(s) not in seen]
                seen.update(map(hash, fresh))
                f.write("".join(s + "\n" for s in fresh))
                if len(seen) >= SP_SENTENCES:
                    break
        if not seen:
            raise InputError(
                f"{path}: no training pairs (every line empty or bad); check the file, or drop --skip-bad-lines"
            )
        return train_sentencepiece(tmp, vocab_size, threads)
    finally:
        tmp.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- objective


def megabatch_size_at(step: int, max_size: int, anneal: int) -> int:
    """Mini-batches per mega-batch after `step` updates: 1, growing by 1 every `anneal` steps, up to max."""
    if anneal <= 0:
        return max_size
    return min(max_size, 1 + step // anneal)


def sentence_groups(ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A group number per sentence; sentences share one exactly when their id sequences are equal."""
    lengths, owner = bag_owners(len(ids), offsets)
    position = torch.arange(len(ids), device=ids.device) - offsets[owner]
    gen = torch.Generator().manual_seed(12345)
    weights = torch.randint(1, 2**62, (int(lengths.max()) + 1,), generator=gen).to(ids.device) | 1
    mixed = (ids + 1) * weights[position]  # int64 arithmetic wraps: a polynomial hash of the sequence
    hashes = torch.zeros(len(offsets), dtype=torch.int64, device=ids.device).index_add_(0, owner, mixed)
    hashes = hashes * 1_000_003 + lengths
    return torch.unique(hashes, return_inverse=True)[1]


def forbidden_pairs(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchor, candidate) index pairs that may never be a negative; sentences 0..n-1 are sources and
    n..2n-1 their partners. Candidate y is forbidden for anchor x when y is a copy of x or of x's
    partner, or y's partner is a copy of x (y is a known paraphrase). The relation is symmetric."""
    n2 = len(groups)
    partner = (torch.arange(n2, device=groups.device) + n2 // 2) % n2
    order = torch.argsort(groups, stable=True)
    counts = torch.bincount(groups)
    starts = torch.cumsum(counts, 0) - counts

    def members(anchors: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = counts[keys]
        rows = torch.repeat_interleave(anchors, c)
        shift = torch.repeat_interleave(torch.cumsum(c, 0) - c - starts[keys], c)
        return rows, order[torch.arange(len(rows), device=groups.device) - shift]

    everyone = torch.arange(n2, device=groups.device)
    same_x, copy_x = members(everyone, groups)  # y is a copy of x
    same_p, copy_p = members(everyone, groups[partner])  # y is a copy of x's partner
    rows = torch.cat([same_x, same_p, copy_p])  # and the transpose: y's partner is a copy of x
    cols = torch.cat([copy_x, copy_p, same_p])
    return rows, cols


@torch.no_grad()
def mine_hardest(
    vectors: torch.Tensor,
    groups: torch.Tensor,
    bitext: bool,
    dtype: torch.dtype = torch.bfloat16,
    chunk: int = MINE_CHUNK,
) -> torch.Tensor:
    """Index of the hardest allowed negative of each of the 2n sentences (-1 where none is allowed).

    With bitext a source's candidates are the targets and vice versa; otherwise every sentence. The
    cosine matrix is computed in blocks of `chunk` rows as matrix products in `dtype`; each block
    serves both its rows and (by symmetry) its columns, so no pair of blocks is computed twice.
    """
    n2 = len(vectors)
    n = n2 // 2
    unit = F.normalize(vectors.float(), dim=1).to(dtype)
    copies = int(torch.bincount(groups).max()) if n2 else 0
    if copies > MAX_LISTED_COPIES:  # listing the pairs would take copies^2 memory: compare groups per block
        partner_groups = groups[(torch.arange(n2, device=groups.device) + n) % n2]
        bad_rows = bad_cols = None
    else:
        bad_rows, bad_cols = forbidden_pairs(groups)
    best = torch.full((n2,), -math.inf, device=vectors.device)
    arg = torch.full((n2,), -1, dtype=torch.int64, device=vectors.device)

    def update(index: torch.Tensor, values: torch.Tensor, where: torch.Tensor) -> None:
        values = values.float()
        better = values > best[index]
        best[index] = torch.where(better, values, best[index])
        arg[index] = torch.where(better, where, arg[index])

    if bitext:  # sources x targets: every block
        starts = range(0, n, chunk)
        blocks = [(a, min(a + chunk, n), n + b, min(n + b + chunk, n2)) for a in starts for b in starts]
    else:  # all x all: the upper triangle of blocks
        starts = range(0, n2, chunk)
        blocks = [(a, min(a + chunk, n2), b, min(b + chunk, n2)) for i, a in enumerate(starts) for b in starts[i:]]
    for r0, r1, c0, c1 in blocks:
        sim = unit[r0:r1] @ unit[c0:c1].T
        if bad_rows is None:  # forbidden_pairs' relation, by group numbers
            rows, cols = groups[r0:r1, None], groups[None, c0:c1]
            sim.masked_fill_(
                (rows == cols) | (partner_groups[r0:r1, None] == cols) | (rows == partner_groups[None, c0:c1]),
                -math.inf,
            )
        else:
            inside = (bad_rows >= r0) & (bad_rows < r1) & (bad_cols >= c0) & (bad_cols < c1)
            sim[bad_rows[inside] - r0, bad_cols[inside] - c0] = -math.inf
        values, where = sim.max(dim=1)
        update(torch.arange(r0, r1, device=sim.device), values, where + c0)
        if r0 != c0:
            values, where = column_max(sim)
            update(torch.arange(c0, c1, device=sim.device), values, where + r0)
    return torch.where(best > -math.inf, arg, -1)


def column_max(sim: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sim.max(dim=0): each column's maximum and the first row holding it. Read as a max without
    indices plus one comparison, it runs several times faster on CPUs than torch's indexed max along dim 0."""
    values = sim.amax(dim=0)
    rows, cols = (sim == values).nonzero(as_tuple=True)
    first = torch.full(values.shape, len(sim), dtype=torch.int64, device=sim.device)
    return values, first.scatter_reduce_(0, cols, rows, "amin")


def mining_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype of the mining products: --mine-precision, with auto meaning bf16 only where it is native."""
    if precision == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    return torch.bfloat16 if precision == "bf16" else torch.float32


def margin_loss(
    src: torch.Tensor,
    tgt: torch.Tensor,
    neg_src: torch.Tensor,
    neg_tgt: torch.Tensor | None = None,
    delta: float = 0.4,
    valid_src: torch.Tensor | None = None,
    valid_tgt: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over pairs of [delta - cos(s, t) + cos(s, t')]_+, plus [delta - cos(s, t) + cos(t, s')]_+
    when `neg_tgt` is given (the symmetric form). Pairs whose negative is not valid add nothing."""
    positive = F.cosine_similarity(src, tgt)
    loss = (delta - positive + F.cosine_similarity(src, neg_src)).clamp_min(0)
    if valid_src is not None:
        loss = loss * valid_src
    if neg_tgt is not None:
        other = (delta - positive + F.cosine_similarity(tgt, neg_tgt)).clamp_min(0)
        loss = loss + (other if valid_tgt is None else other * valid_tgt)
    return loss.mean()


def distill_loss(vectors: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cosine distance of sentence vectors to their teacher targets."""
    return (1 - F.cosine_similarity(vectors, targets, dim=1)).mean()


def relational_loss(vectors: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared difference between the batch's cosine matrix and the teacher's: it keeps how the teacher
    ranks the sentences of a batch against each other, which is what STS and retrieval measure."""
    s, t = F.normalize(vectors, dim=1), F.normalize(targets, dim=1)
    return (s @ s.T - t @ t.T).pow(2).mean()


def contrastive_loss(
    vectors: torch.Tensor, targets: torch.Tensor, temperature: float, soft: float = 0.0
) -> torch.Tensor:
    """In-batch InfoNCE, both ways: each sentence's vector must be nearer its own teacher target than the batch's
    other targets (cosine / temperature), and each target nearer its own sentence. It teaches which sentences are
    near which, as STS asks, where the cosine loss only pulls each vector toward its target. With `soft` > 0 the
    labels are the teachers' own distribution over the batch (their cosines / soft) instead of one-hot."""
    unit = F.normalize(targets, dim=1)
    logits = F.normalize(vectors, dim=1) @ unit.T / temperature
    labels = (unit @ unit.T / soft).softmax(1) if soft else torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def scramble(ids: torch.Tensor, offsets: torch.Tensor, rate: float) -> torch.Tensor:
    """Shuffle the token order of each bag with probability `rate` (the papers' scrambling for LSTMs)."""
    lengths, owner = bag_owners(len(ids), offsets)
    shuffled = torch.rand(len(offsets), device=ids.device) < rate
    position = (torch.arange(len(ids), device=ids.device) - offsets[owner]).double()
    key = torch.where(shuffled[owner], torch.rand(len(ids), device=ids.device, dtype=torch.float64), position)
    order = torch.argsort(key, stable=True)
    return ids[order[torch.argsort(owner[order], stable=True)]]


def unique_rows(ids: torch.Tensor, spare: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct table rows of a batch and each id's position among them (torch.unique's). With `spare` the rows
    come in a fixed size, len(ids): the distinct ones ascending, then the spare row (one past the table, never in
    a bag) as filler, so that a GPU never has to tell the host how many there are."""
    if spare is None:
        return torch.unique(ids, return_inverse=True)
    ordered, order = torch.sort(ids)
    new = torch.ones_like(ordered, dtype=torch.bool)
    new[1:] = ordered[1:] != ordered[:-1]
    slot = torch.cumsum(new, 0) - 1
    return torch.full_like(ids, spare).scatter_(0, slot, ordered), torch.empty_like(slot).scatter_(0, order, slot)


def segment_mean(table: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
    """mean_pool by a gather and an index_add: the same means, with a backward pass that never waits on the GPU
    (embedding_bag's reads its number of distinct ids back to the host)."""
    total = torch.full((1,), len(ids), dtype=offsets.dtype, device=offsets.device)
    lengths = torch.diff(offsets, append=total)
    owner = torch.repeat_interleave(torch.arange(len(offsets), device=ids.device), lengths, output_size=len(ids))
    rows = F.dropout(table.index_select(0, ids), p=dropout, training=dropout > 0)
    sums = torch.zeros(len(offsets), table.shape[1], dtype=table.dtype, device=table.device).index_add_(0, owner, rows)
    return sums / lengths.clamp_min(1).unsqueeze(1).to(table.dtype)


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value is finite, read from the tensors' sums (a NaN or inf makes its sum non-finite;
    torch.isfinite over a large tensor is several times slower than a sum)."""
    return all(map(math.isfinite, torch.stack([t.sum() for t in tensors]).tolist()))


def clip_gradient(grads: list[torch.Tensor], max_norm: float | None, on_device: bool = False) -> float | None:
    """Scale `grads` in place so their joint L2 norm is at most `max_norm`; returns the norm before clipping
    (`on_device`: the scale is computed and applied where the gradients are, and nothing is returned)."""
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    if on_device:
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale)
        return None
    norm = float(norm)
    if max_norm and norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-6))
    return norm


# ----------------------------------------------------------------------------- optimizers


class LazyAdam:
    """Adam that reads and writes only the rows in the batch (row-sparse, like tf LazyAdam).

    Its cost scales with the batch, not the vocabulary; rows absent from a step keep their moments.
    With every row in every batch it is torch.optim.Adam. The moments are two (rows, dim) tables and
    a step gathers its rows into buffers kept between steps: on machines where fresh pages are dear
    (virtual machines), allocating tens of MiB per step costs more than the arithmetic.
    """

    def __init__(self, table: torch.Tensor, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, spare: int = 0):
        """`spare`: rows at the end of `table` that are no part of the model (unique_rows' filler), never saved."""
        self.table, self.lr, self.betas, self.eps = table, lr, betas, eps
        self.rows = table.shape[0] - spare
        self.moments = torch.zeros(2, *table.shape, dtype=table.dtype, device=table.device)
        self.buffers = torch.empty(0, dtype=table.dtype, device=table.device)
        self.steps = 0
        self.counted: torch.Tensor | None = None  # the step count on the device, for masked steps

    @torch.no_grad()
    def step(self, rows: torch.Tensor, grad: torch.Tensor, ok: torch.Tensor | None = None) -> None:
        """Apply one Adam update to `rows` (unique) given their gradient; with `ok` (a boolean on the device) the
        update, moments and step count change only where it is true, decided on the device without a wait."""
        if ok is not None:
            return self._masked_step(rows, grad, ok)
        self.steps += 1
        b1, b2 = self.betas
        if self.buffers.numel() < 2 * grad.numel():
            self.buffers = torch.empty(2 * grad.numel(), dtype=grad.dtype, device=grad.device)
        m, v = self.buffers[: 2 * grad.numel()].view(2, *grad.shape)
        torch.index_select(self.moments[0], 0, rows, out=m).lerp_(grad, 1 - b1)
        torch.index_select(self.moments[1], 0, rows, out=v).mul_(b2).addcmul_(grad, grad, value=1 - b2)
        self.moments[0].index_copy_(0, rows, m)
        self.moments[1].index_copy_(0, rows, v)
        root = math.sqrt(1 - b2**self.steps)  # lr * m / (sqrt(v / root**2) + eps), rearranged to save a pass
        update = m.div_(v.sqrt_().add_(self.eps * root))
        self.table.index_add_(0, rows, update, alpha=-self.lr * root / (1 - b1**self.steps))

    def _masked_step(self, rows: torch.Tensor, grad: torch.Tensor, ok: torch.Tensor) -> None:
        """`step`'s arithmetic with the step count and the bias corrections as device tensors, kept or discarded
        by `ok` (a skipped batch leaves everything as it was, as on the host's path)."""
        if self.counted is None:
            self.counted = torch.tensor(self.steps, dtype=torch.float64, device=self.table.device)
        self.counted += ok
        b1, b2 = self.betas
        m_old, v_old = self.moments[0].index_select(0, rows), self.moments[1].index_select(0, rows)
        m = torch.where(ok, m_old.lerp(grad, 1 - b1), m_old)
        v = torch.where(ok, v_old * b2 + (1 - b2) * grad * grad, v_old)
        self.moments[0].index_copy_(0, rows, m)
        self.moments[1].index_copy_(0, rows, v)
        root = torch.sqrt(1 - b2**self.counted)
        step = (self.lr * root / (1 - b1**self.counted)).to(grad.dtype)
        update = torch.where(ok, m / (v.sqrt() + self.eps * root.to(grad.dtype)), 0)
        self.table.index_add_(0, rows, update * -step)

    def state_dict(self) -> dict:
        steps = self.steps if self.counted is None else int(self.counted)
        return {"steps": steps, "moments": self.moments[:, : self.rows]}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.counted = int(state["steps"]), None
        self.moments[:, : self.rows].copy_(state["moments"])


# ----------------------------------------------------------------------------- training


class DistillStream:
    """Sentences with teacher target vectors (train.py --distill), served in batches.

    Batch k is a slice of a seeded permutation of one pass over the sentences (with neighbours, those anchors and
    their nearest in a pool seeded by the step), so the stream's position follows from the step alone and resume
    needs no extra state.
    """

    def __init__(
        self,
        model: Model,
        sentence_file: Path,
        target_file: Path,
        batch_size: int,
        seed: int,
        any_dim: bool = False,
        neighbours: int = 0,
        pool: int = 4096,
    ):
        self.model, self.seed, self.neighbours, self.pool = model, seed, neighbours, pool
        self.anchors = max(batch_size // (neighbours + 1), 1)  # sentences drawn in order; the rest are neighbours
        threads = torch.get_num_threads()
        chunks = [model.token_ids(lines, threads) for lines in iter_line_chunks(sentence_file)]
        if not chunks:
            raise InputError(f"{sentence_file}: no sentences to distill")
        self.flat = np.concatenate([c[0] for c in chunks])
        self.lengths = np.concatenate([c[1] for c in chunks])
        try:
            targets = np.load(target_file, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise InputError(f"{target_file}: not a readable .npy of target vectors ({e})") from None
        dim = targets.shape[-1] if any_dim else model.dim
        if targets.ndim != 2 or targets.shape != (len(self.lengths), dim):
            raise InputError(
                f"{target_file}: shape {targets.shape}, expected ({len(self.lengths)}, {dim}): one target "
                f"vector per line of {sentence_file}" + ("" if any_dim else ", of the model's dimension")
            )
        self.targets = torch.from_numpy(np.array(targets, dtype=np.float32))
        broken = torch.nonzero(~torch.isfinite(self.targets).all(1))
        if len(broken):
            row = int(broken[0])
            raise InputError(
                f"{target_file}: row {row} (line {row + 1} of {sentence_file}) holds NaN or infinite values, and "
                f"{len(broken)} rows in all; recompute the targets"
            )
        self.per_pass = max(len(self.lengths) // self.anchors, 1)
        self.order: tuple[int, np.ndarray] | None = None

    def batch(self, step: int, device: torch.device) -> tuple[Bags, torch.Tensor]:
        """(bags, targets) of the distillation batch that goes with update `step`."""
        epoch, k = divmod(step, self.per_pass)
        if self.order is None or self.order[0] != epoch:
            self.order = (epoch, np.random.default_rng((self.seed, epoch)).permutation(len(self.lengths)))
        idx = self.order[1][k * self.anchors : (k + 1) * self.anchors]
        if self.neighbours:
            idx = self.with_neighbours(idx, step)
        bags = self.model.rows_and_offsets(*take_bags(self.flat, self.lengths, idx))
        return bags.to(device), self.targets[idx].to(device)

    def with_neighbours(self, anchors: np.ndarray, step: int) -> np.ndarray:
        """Each anchor followed by its `neighbours` nearest sentences, by the teachers' targets, among a random pool
        of `pool` (the paper's mega-batch, mined with the teacher's similarity): hard negatives for the in-batch
        contrastive term. A sentence drawn twice is kept once."""
        rng = np.random.default_rng((self.seed, step, 1))
        pool = torch.from_numpy(rng.choice(len(self.lengths), min(self.pool, len(self.lengths)), replace=False))
        first = torch.from_numpy(anchors)
        sim = F.normalize(self.targets[first], dim=1) @ F.normalize(self.targets[pool], dim=1).T
        sim[pool[None, :] == first[:, None]] = -2  # never an anchor's own row
        near = pool[sim.topk(min(self.neighbours, len(pool)), dim=1).indices]
        idx = torch.cat([first[:, None], near], 1).ravel().numpy()
        _, once = np.unique(idx, return_index=True)
        return idx[np.sort(once)]


class MegaBatch:
    """The 2n sentences of n pairs (sources first) on the device, and each one's mined negative."""

    def __init__(self, model: Model, data: PairData, device: torch.device):
        self.n = len(data)
        flat = np.concatenate([data.src[0], data.tgt[0]])
        lengths = np.concatenate([data.src[1], data.tgt[1]])
        bags = model.rows_and_offsets(flat, lengths)
        self.host_lengths = bags.lengths().numpy()  # the host's copy: a mini-batch's size without asking the GPU
        self.sentences = bags.to(device)
        self.lengths = self.sentences.lengths()
        self.negatives: torch.Tensor | None = None
        self.host_negatives: np.ndarray | None = None

    def mine(self, model: Model, bitext: bool, dtype: torch.dtype) -> None:
        """Embed every sentence without dropout and pick each one's hardest negative."""
        with torch.no_grad():
            s = self.sentences
            vectors = torch.cat([model(*s.slice(a, a + EMBED_CHUNK)) for a in range(0, 2 * self.n, EMBED_CHUNK)])
        self.negatives = mine_hardest(vectors, sentence_groups(*self.sentences), bitext, dtype)
        self.host_negatives = None

    def minibatch(self, start: int, stop: int, one_sided: bool):
        """(bags, validity) of [sources, targets, negatives of sources(, negatives of targets)]."""
        pairs = torch.arange(start, stop, device=self.lengths.device)
        idx, negatives = minibatch_sentences(pairs, self.n, self.negatives, one_sided)
        total = self.ids_in(start, stop, one_sided) if idx.is_cuda or SYNC_FREE_ON_CPU else None
        return self.sentences.take(idx, self.lengths, total), [(neg >= 0).float() for neg in negatives]

    def ids_in(self, start: int, stop: int, one_sided: bool) -> int:
        """The number of ids in `minibatch(start, stop)`'s bags, from the host's copies (the negatives are read
        back once a mega-batch), so that a GPU's step needs no answer from it."""
        if self.host_negatives is None:
            self.host_negatives = self.negatives.cpu().numpy()
        idx, _ = minibatch_sentences(np.arange(start, stop), self.n, self.host_negatives, one_sided)
        return int(self.host_lengths[idx].sum())


def minibatch_sentences(pairs, n, negatives, one_sided: bool):
    """(positions of a mini-batch's sentences in its mega-batch, the anchors' negatives): the pairs' sources and
    targets, then each anchor's mined negative, its partner where none was allowed. Torch tensors or numpy arrays
    alike, so the GPU's step, its graph and the host's count of its ids share one layout."""
    where, cat = (torch.where, torch.cat) if isinstance(pairs, torch.Tensor) else (np.where, np.concatenate)
    anchors = [pairs] if one_sided else [pairs, pairs + n]
    negs = [negatives[a] for a in anchors]
    fallback = [where(neg >= 0, neg, (a + n) % (2 * n)) for neg, a in zip(negs, anchors, strict=True)]
    return cat([pairs, pairs + n, *fallback]), negs


class GraphedSteps:
    """Mini-batch updates of fixed shapes, recorded once as a CUDA graph and replayed: a step then costs the host one
    launch instead of a hundred, which is what a GPU's step at batch 128 waits for otherwise.

    Each mega-batch is copied into buffers that keep their addresses; a step reads its pairs from them by its start
    (a one-number buffer) and pads its ids to C, a power of two fixed for the mega-batch, with a last bag of the
    spare row that no loss reads. The first step of each shape runs directly (warming the kernels up) and is then
    recorded; where recording fails, or off a GPU (the tests), every step runs that same code directly.
    """

    def __init__(self, trainer: Trainer):
        self.trainer, self.device = trainer, trainer.device
        self.record = trainer.device.type == "cuda"
        self.graphs: dict[int, torch.cuda.CUDAGraph | None] = {}
        self.loaded: MegaBatch | None = None
        self.size = self.capacity = 0
        self.numbers = torch.zeros(3, dtype=torch.int64, device=self.device)  # start, n, where the padding sits
        self.loss = torch.zeros((), device=self.device)

    def step(self, mb: MegaBatch, lo: int, hi: int) -> torch.Tensor | None:
        """The update of mini-batch [lo, hi) of `mb` (its loss), or None for train_step to do (a short one)."""
        if hi - lo != self.trainer.config.batch_size:
            return None
        if mb is not self.loaded:
            self.load(mb)
        self.numbers[0].fill_(lo)
        graph = self.graphs.get(self.size)
        if graph is not None:
            graph.replay()
        else:
            self.first_run()
        return self.loss.clone()

    def load(self, mb: MegaBatch) -> None:
        """Copy a new mega-batch into the buffers (grown, and the graphs dropped, when it does not fit) and fix the
        padded size of its steps."""
        batch, one_sided = self.trainer.config.batch_size, self.trainer.config.one_sided
        most = max((mb.ids_in(lo, lo + batch, one_sided) for lo in range(0, mb.n - batch + 1, batch)), default=1)
        self.size = 1 << (most - 1).bit_length()  # a power of two: few shapes over a run, few graphs
        ids, n2 = len(mb.sentences.ids), 2 * mb.n
        if ids + self.size > self.capacity or n2 > len(getattr(self, "offsets", ())):
            self.capacity = 1 << (ids + self.size).bit_length()
            self.ids = torch.empty(self.capacity, dtype=torch.int64, device=self.device)
            self.offsets, self.lengths, self.negatives = (
                torch.empty(1 << n2.bit_length(), dtype=torch.int64, device=self.device) for _ in range(3)
            )
            self.positions = torch.arange(max(self.capacity, len(self.offsets)), device=self.device)
            self.graphs = {}
        self.ids[:ids].copy_(mb.sentences.ids)
        self.ids[ids : ids + self.size].fill_(self.trainer.optimizer.rows)  # the padding: the spare row
        self.offsets[:n2].copy_(mb.sentences.offsets)
        self.lengths[:n2].copy_(mb.lengths)
        self.negatives[:n2].copy_(mb.negatives)
        self.numbers[1].fill_(mb.n)
        self.numbers[2].fill_(ids)
        self.loaded = mb

    def first_run(self) -> None:
        """Run a step of a new shape directly (on a side stream, as a graph's warm-up must), then record it."""
        if not self.record:
            return self.run()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.run()
        except RuntimeError as e:  # recording refused: every step runs directly from here on, as on a CPU
            tqdm.write(f"warning: CUDA graphs unavailable ({str(e).splitlines()[0]}); steps run one kernel at a time")
            self.record = False
            return
        self.graphs[self.size] = graph

    def run(self) -> None:
        """The step itself, in fixed shapes: MegaBatch.minibatch's bags padded to `size` ids, then train_step."""
        config, trainer = self.trainer.config, self.trainer
        batch, size = config.batch_size, self.size
        start, n, pad_at = self.numbers[0], self.numbers[1], self.numbers[2]
        idx, negatives = minibatch_sentences(start + self.positions[:batch], n, self.negatives, config.one_sided)
        lens = self.lengths[idx]
        lens = torch.cat([lens, (size - lens.sum()).view(1)])  # the padding bag takes the rest
        sources = torch.cat([self.offsets[idx], pad_at.view(1)])
        offsets = torch.cumsum(lens, 0) - lens
        ids = self.ids[self.positions[:size] - torch.repeat_interleave(offsets - sources, lens, output_size=size)]
        rows, local = unique_rows(ids, trainer.optimizer.rows)
        sub = trainer.optimizer.table.index_select(0, rows).requires_grad_()
        vectors = segment_mean(sub, local, offsets, config.dropout)[:-1]
        loss = trainer.margin(vectors, [(neg >= 0).float() for neg in negatives])
        loss.backward()
        self.loss.copy_(trainer.apply_on_device(loss, rows, sub.grad))


class NonFiniteLoss(Error):
    """The loss, gradient or table became NaN or infinite and --on-nan stop ends the run (exit 3)."""

    exit_code = 3


class Trainer:
    """The training loop: data position, mega-batches, updates, checkpoints and dev evaluation."""

    def __init__(
        self,
        config: Config,
        model: Model,
        sampler: PairSampler,
        on_step: Callable[[Trainer], None] | None = None,
        ranks: Ranks = ALONE,
    ):
        self.config, self.model, self.sampler, self.on_step, self.ranks = config, model, sampler, on_step, ranks
        self.out, self.quiet = config.output_dir, False  # quiet: no progress bar (--quiet; not a setting of the run)
        self.device = model.device
        self.dense = list(model.lstms.parameters())  # LSTM weights: every step touches all of them
        # On a GPU a step never waits for the device: fixed-size rows, flags kept there (one process, no LSTM)
        self.sync_free = (self.device.type == "cuda" or SYNC_FREE_ON_CPU) and ranks.world == 1 and not self.dense
        table = model.embedding.weight.data
        if self.sync_free:  # one spare row past the table takes unique_rows' filler
            table = torch.cat([table, table.new_zeros(1, table.shape[1])])
            model.embedding.weight.data = table[:-1]
        self.optimizer = LazyAdam(table, config.lr, spare=int(self.sync_free))
        self.bad = torch.zeros((), dtype=torch.int64, device=self.device)  # non-finite updates not yet reported
        self.inputs = input_fingerprints(config)  # saved with the state, compared on --resume
        plain = not (config.distill or config.relate or config.scramble_rate) and model.poolings == ["mean"]
        self.graphs = GraphedSteps(self) if self.sync_free and plain else None
        self.dense_optimizer = torch.optim.Adam(self.dense, lr=config.lr) if self.dense else None
        self.mine_dtype = mining_dtype(config.mine_precision, self.device)
        self.step = self.epoch = self.offset = self.inner = 0
        self.megabatch: MegaBatch | None = None
        self.distill = (
            DistillStream(
                model,
                *config.distill,
                config.distill_batch_size or config.batch_size,
                config.seed,
                neighbours=config.distill_neighbours,
                pool=config.distill_pool,
            )
            if config.distill
            else None
        )
        self.relate = (
            DistillStream(
                model, *config.relate, config.distill_batch_size or config.batch_size, config.seed + 1, any_dim=True
            )
            if config.relate
            else None
        )
        self.best: float | None = None
        self.skipped = 0  # batches skipped for a non-finite loss (--on-nan skip)
        self.stop_requested = False
        self.saved_at: int | None = None
        self.seconds = {"read": 0.0, "mine": 0.0, "update": 0.0, "save": 0.0}  # where the time goes
        steps_per_epoch = math.ceil(len(sampler) / config.batch_size)
        self.total_steps = min(config.epochs * steps_per_epoch, config.max_steps or math.inf)

    # -- state

    def state_dict(self) -> dict:
        mb = self.megabatch
        return {
            "format": STATE_FORMAT,
            "format_version": STATE_VERSION,
            "args": self.config.plain(),
            "model": self.model.checkpoint(),
            "optimizer": self.optimizer.state_dict(),
            "dense_optimizer": self.dense_optimizer.state_dict() if self.dense_optimizer else None,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state() if self.device.type == "cuda" else None,
            "position": {"step": self.step, "epoch": self.epoch, "offset": self.offset, "inner": self.inner},
            "megabatch_pairs": mb.n if mb is not None else 0,
            "negatives": mb.negatives.cpu() if mb is not None else None,
            "best": self.best,
            "skipped": self.skipped,
            "num_pairs": len(self.sampler),
            "inputs": self.inputs,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["num_pairs"] != len(self.sampler):
            raise InputError(
                f"{self.out / 'resume.pt'}: the run trained on {state['num_pairs']} pairs but the data given has "
                f"{len(self.sampler)}; resume with the same training data (--force-resume accepts other files, but "
                "only with as many pairs: the saved position counts them)"
            )
        self.model.embedding.weight.data.copy_(state["model"]["embedding"])
        self.model.lstms.load_state_dict(state["model"].get("lstm") or {})
        self.optimizer.load_state_dict(state["optimizer"])
        if self.dense_optimizer:
            self.dense_optimizer.load_state_dict(state["dense_optimizer"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"])
        pos = state["position"]
        self.step, self.epoch, self.offset, self.inner = pos["step"], pos["epoch"], pos["offset"], pos["inner"]
        self.best = state["best"]
        self.skipped = state.get("skipped", 0)
        if state["negatives"] is not None:
            data = self.sampler.read(self.epoch, self.offset, state["megabatch_pairs"])
            self.megabatch = MegaBatch(self.model, data, self.device)
            negatives = state["negatives"]
            n2 = 2 * self.megabatch.n
            fits = negatives.shape == (n2,) and negatives.dtype == torch.int64
            if not (fits and bool(((negatives >= -1) & (negatives < n2)).all())):
                raise ValueError(f"the saved negatives do not fit a mega-batch of {self.megabatch.n} pairs")
            self.megabatch.negatives = negatives.to(self.device)

    # -- loop

    def train(self) -> int:
        """Run until --epochs or --max-steps; a first Ctrl-C saves and stops (exit 130)."""
        config = self.config
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=not self.ranks.is_main or self.quiet,
        )  # rank 0 alone shows progress
        window = {"loss": 0.0, "steps": 0, "pairs": 0, "time": time.perf_counter(), "saved": 0.0}
        with bar, self._sigint_saves():
            while self.step < self.total_steps and not self.ranks.any(self.stop_requested):
                if self.megabatch is None and not self._next_megabatch():
                    continue
                mb = self.megabatch
                m = math.ceil(mb.n / config.batch_size)
                while self.inner < m and self.step < self.total_steps and not self.ranks.any(self.stop_requested):
                    lo, start = self.inner * config.batch_size, time.perf_counter()
                    loss = self.update(mb, lo, min(lo + config.batch_size, mb.n))
                    self.seconds["update"] += time.perf_counter() - start
                    self.step += 1
                    self.inner += 1
                    if loss is not None:  # None: skipped for a non-finite loss
                        window["loss"] += loss
                        window["steps"] += 1
                    window["pairs"] += min(lo + config.batch_size, mb.n) - lo
                    bar.update(1)
                    if self.step % config.log_every == 0 or self.step == self.total_steps:
                        self._log_progress(window, bar, m)
                    if config.save_every and self.step % config.save_every == 0:
                        self.checkpoint()
                    if self.on_step is not None:
                        self.on_step(self)
                if self.inner == m:
                    self.offset += mb.n
                    self.megabatch, self.inner = None, 0
            self.checkpoint()
        if self.stop_requested:
            print(f"interrupted at step {self.step}: state saved; continue with --resume", file=sys.stderr)
            return 130
        return 0

    def _next_megabatch(self) -> bool:
        """Read and mine the next mega-batch; at the end of an epoch move to the next (False then)."""
        if self.offset >= len(self.sampler):
            self.epoch, self.offset = self.epoch + 1, 0
            self.checkpoint()
            if self.epoch >= self.config.epochs:
                self.total_steps = self.step
            return False
        m = megabatch_size_at(self.step, self.config.megabatch_size, self.config.megabatch_anneal)
        start = time.perf_counter()
        data = self.sampler.read(self.epoch, self.offset, m * self.config.batch_size)
        self.megabatch = MegaBatch(self.model, data, self.device)
        read = time.perf_counter()
        self.megabatch.mine(self.model, self.config.mode == "bitext", self.mine_dtype)
        self.megabatch = self.ranks.view(self.megabatch, data)  # this rank's slices, in global positions
        self.seconds["read"] += read - start
        self.seconds["mine"] += time.perf_counter() - read
        return True

    def train_step(self, bags: Bags, valid: list[torch.Tensor]) -> float | torch.Tensor | None:
        """One update on a mini-batch: gather the rows it uses, pool, margin loss (plus the distillation
        loss with --distill), row-sparse gradient for the table, dense for LSTM weights."""
        pooled = len(bags.offsets)  # the margin loss's sentences; distillation's follow them
        if self.config.scramble_rate:
            bags = Bags(scramble(*bags, self.config.scramble_rate), bags.offsets)
        if self.distill is not None:
            distilled, targets = self.distill.batch(self.step, self.device)
            bags = bags.cat(distilled)
        if self.relate is not None:
            related, relations = self.relate.batch(self.step, self.device)
            bags = bags.cat(related)
        parts = self.model.split_parts(*bags)
        spare = self.optimizer.rows if self.sync_free else None
        rows, local = unique_rows(torch.cat([p[0] for p in parts]), spare)
        sub = self.optimizer.table.index_select(0, rows).requires_grad_()
        local_parts = list(zip(local.split([len(p[0]) for p in parts]), (p[1] for p in parts), strict=True))
        if self.dense_optimizer:
            self.dense_optimizer.zero_grad()
        if self.sync_free and self.model.poolings == ["mean"]:
            vectors = segment_mean(sub, *local_parts[0], self.config.dropout)
        else:
            vectors = self.model.pool_parts(sub, local_parts, self.config.dropout)
        loss = self.margin(vectors[:pooled], valid)
        if self.distill is not None:
            taught = vectors[pooled : pooled + len(targets)]
            loss = loss + self.config.distill_weight * distill_loss(taught, targets)
            if self.config.distill_relational:
                loss = loss + self.config.distill_relational * relational_loss(taught, targets)
            if self.config.distill_contrastive:
                loss = loss + self.config.distill_contrastive * contrastive_loss(
                    taught, targets, self.config.distill_temperature, self.config.distill_soft
                )
        if self.relate is not None:
            loss = loss + self.config.relate_weight * relational_loss(vectors[-len(relations) :], relations)
        loss.backward()
        if self.sync_free:
            return self.apply_on_device(loss, rows, sub.grad)
        rows, grad, loss = self.ranks.sum_rows(rows, sub.grad, loss)
        self.ranks.mean_([p.grad for p in self.dense])  # the LSTM weights' gradients
        grads = [grad] + [p.grad for p in self.dense]
        if not all_finite([loss, *grads]):
            return self.non_finite(loss.item())
        if self.config.grad_clip:
            clip_gradient(grads, self.config.grad_clip)
        self.optimizer.step(rows, grad)
        if self.dense_optimizer:
            self.dense_optimizer.step()
        return loss.item()

    def margin(self, vectors: torch.Tensor, valid: list[torch.Tensor]) -> torch.Tensor:
        """The weighted margin loss of a mini-batch's vectors: sources, targets, then their negatives' (one or two
        groups of the mini-batch's size)."""
        parts = vectors.split(len(valid[0]))
        if self.config.one_sided:
            loss = margin_loss(parts[0], parts[1], parts[2], None, self.config.delta, valid[0])
        else:
            loss = margin_loss(parts[0], parts[1], parts[2], parts[3], self.config.delta, valid[0], valid[1])
        return self.config.margin_weight * loss

    def apply_on_device(self, loss: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The update of a step that never waits for the GPU: the finiteness check, clipping and Adam all stay on
        the device (a non-finite update is masked there and counted in `bad`, read at the next log or save);
        returns the loss, 0 where masked."""
        ok = torch.isfinite(loss) & torch.isfinite(grad.sum())
        self.bad += ~ok
        if self.config.grad_clip:
            clip_gradient([grad], self.config.grad_clip, on_device=True)
        self.optimizer.step(rows, grad, ok)
        return torch.where(ok, loss.detach(), 0)

    def update(self, mb: MegaBatch, lo: int, hi: int) -> float | torch.Tensor | None:
        """One mini-batch's update: replayed from a CUDA graph where one serves it, else train_step."""
        if self.graphs is not None and (loss := self.graphs.step(mb, lo, hi)) is not None:
            return loss
        return self.train_step(*mb.minibatch(lo, hi, self.config.one_sided))

    def report_skipped(self) -> None:
        """Read the device's count of non-finite updates (masked there) and act on them as non_finite does: a
        warning per batch with --on-nan skip, else stop, with resume.pt still the last good checkpoint."""
        bad = int(self.bad)
        if not bad:
            return
        self.bad.zero_()
        what = f"{bad} update(s) up to update {self.step} had a non-finite loss or gradient and were not applied"
        if self.config.on_nan == "skip":
            self.skipped += bad
            tqdm.write(f"warning: {what}; batches skipped ({self.skipped} so far, --on-nan skip)", file=sys.stderr)
            return
        raise self.stopped(what)

    def non_finite(self, loss: float) -> None:
        """A non-finite loss or gradient: skip the batch with a warning (--on-nan skip), or stop (default)."""
        what = f"the loss is {loss}" if not math.isfinite(loss) else "the gradient is not finite"
        if self.config.on_nan == "skip":
            self.skipped += 1
            msg = f"warning: update {self.step + 1}: {what}; batch skipped ({self.skipped} so far, --on-nan skip)"
            tqdm.write(msg, file=sys.stderr)
            return None
        raise self.stopped(f"{what} at update {self.step + 1}")

    def stopped(self, what: str) -> NonFiniteLoss:
        """The error that ends a run gone non-finite; nothing more is saved, so the last good checkpoint stays."""
        resume = self.out / "resume.pt"
        kept = f"{resume}: kept as the last good checkpoint" if resume.exists() else f"{self.out}: nothing saved yet"
        hint = "resume with --resume and a lower --lr or a --grad-clip, or skip such batches with --on-nan skip"
        return NonFiniteLoss(f"{kept}; training stopped: {what} ({hint})")

    # -- outputs

    def _log_progress(self, window: dict, bar: tqdm, m: int) -> None:
        loss = float(window["loss"]) / max(window["steps"], 1)  # on a GPU the one wait for it in a log window
        self.report_skipped()
        now = time.perf_counter()
        saving = self.seconds["save"] - window["saved"]
        rate = window["pairs"] / max(now - window["time"] - saving, 1e-9)
        bar.set_postfix(loss=f"{loss:.4f}", pairs_s=f"{rate:.0f}", M=m)
        self._metrics(
            {"event": "train", "step": self.step, "epoch": self.epoch, "loss": loss, "pairs_per_s": rate, "M": m}
            | {"skipped": self.skipped}
            | {f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()}
        )
        window.update(loss=0.0, steps=0, pairs=0, time=now, saved=self.seconds["save"])

    def _metrics(self, record: dict) -> None:
        if not self.ranks.is_main:  # rank 0 alone writes metrics.jsonl
            return
        path = self.out / "metrics.jsonl"
        with reporting_full_disk(path, "resume.pt keeps the last checkpoint"), open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(evaluate.json_safe({**record, "time": time.time()}), allow_nan=False) + "\n")

    def checkpoint(self) -> None:
        """Dev evaluation (best.pt when it improves), then resume.pt and model.pt, each written atomically.

        Its time is counted apart, so pairs/s measures training alone."""
        if self.saved_at == self.step:
            return
        self.report_skipped()
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):  # never save a broken model
            raise self.stopped(f"the model's weights are not finite at update {self.step}")
        self.saved_at, start = self.step, time.perf_counter()
        self.ranks.main_writes(self._save)  # rank 0 saves, the others wait
        self.seconds["save"] += time.perf_counter() - start

    def _save(self) -> None:
        extra = {"training": {"step": self.step, "epoch": self.epoch, "args": self.config.plain(names_only=True)}}
        try:
            scores = self.dev_scores()
        except Error:  # a dev file that went bad during the run: keep what can be resumed, then say so
            self._save_state(extra)
            raise
        if scores:
            mean = sum(scores.values()) / len(scores)
            improved = math.isfinite(mean) and (self.best is None or mean > self.best)  # a NaN never becomes best
            if improved:
                self.best = mean
                dev = {Path(k).name: v for k, v in scores.items()}
                self.model.save(self.out / "best.pt", extra_config={**extra, "dev_pearson": dev})
            text = " ".join(f"{Path(k).name}={v:.2f}" for k, v in scores.items())
            tqdm.write(f"step {self.step}: dev Pearson {text} (mean {mean:.2f}{', best' if improved else ''})")
            self._metrics({"event": "dev", "step": self.step, "epoch": self.epoch, "pearson": scores, "mean": mean})
        self._save_state(extra)

    def _save_state(self, extra: dict) -> None:
        """resume.pt, then model.pt, each written atomically."""
        with atomic_output(self.out / "resume.pt") as f:
            torch.save(self.state_dict(), f)
        self.model.save(self.out / "model.pt", extra_config=extra)

    def dev_scores(self) -> dict[str, float]:
        """Pearson x 100 of each --dev-file (empty without dev files)."""
        if not self.config.dev_file:
            return {}
        self.model.eval()
        return {str(p): float(evaluate.score_sts_file(self.model, p)["pearson"]) for p in self.config.dev_file}

    @contextlib.contextmanager
    def _sigint_saves(self):
        """The first Ctrl-C finishes the current update, saves and stops; a second one aborts."""

        def handler(signum, frame):
            if self.stop_requested:
                raise KeyboardInterrupt
            self.stop_requested = True
            tqdm.write("interrupt: saving the training state (Ctrl-C again to abort)")

        try:
            previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread: no handler
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


# ----------------------------------------------------------------------------- setup


@dataclass(frozen=True)
class Config:
    """One run's settings: the parsed arguments with every default resolved (--init-from's dimension and
    encoder, the scramble rate, the run's batch under torchrun), fixed from then on; saved in resume.pt
    and compared on --resume (FIXED_ON_RESUME)."""

    train_file: Path | None
    train_shards: tuple[str, ...] | None
    output_dir: Path
    mode: str
    model: str
    combine: str
    scramble_rate: float
    max_types: int
    sp_model: Path | None
    init_from: Path | None
    vocab_size: int
    lowercase: bool | None
    dim: int
    batch_size: int
    megabatch_size: int
    megabatch_anneal: int
    epochs: int
    max_steps: int | None
    lr: float
    delta: float
    dropout: float
    grad_clip: float | None
    mine_precision: str
    one_sided: bool
    distill: tuple[Path, Path] | None
    distill_weight: float
    distill_relational: float
    distill_contrastive: float
    distill_temperature: float
    distill_neighbours: int
    distill_pool: int
    distill_soft: float
    distill_batch_size: int | None
    relate: tuple[Path, Path] | None
    relate_weight: float
    margin_weight: float
    on_nan: str
    save_every: int
    log_every: int
    dev_file: tuple[Path, ...]
    skip_bad_lines: bool
    seed: int
    device: str
    resume: bool
    force_resume: bool
    threads: int | None
    global_megabatch: bool
    dist_backend: str
    world_size: int

    def plain(self, names_only: bool = False) -> dict:
        """The settings as plain values (paths as strings, tuples as lists), for checkpoints loaded with
        weights_only=True; `names_only` keeps only the file names of paths, so that a model file carries
        nothing of this machine."""
        path = (lambda x: Path(x).name) if names_only else str
        plain = {}
        for k, v in asdict(self).items():
            if isinstance(v, tuple):
                v = list(v)
            if k in PATH_ARGS and v is not None:
                v = [path(x) for x in v] if isinstance(v, list) else path(v)
            plain[k] = v
        return plain


def make_config(
    args: argparse.Namespace, device: str, state: dict | None, init: Model | None, ranks: Ranks = ALONE
) -> Config:
    """The run's Config from the parsed arguments and the device this rank trains on: a fresh --init-from
    run takes the model's dimension and encoder, a resumed one those it recorded; LSTMs scramble 30% of
    sentences unless told otherwise."""
    settings = {k: v for k, v in vars(args).items() if k != "quiet"} | {"device": device, "world_size": 1}
    if init is not None:
        settings |= {"dim": init.embedding.embedding_dim, "model": init.kind.replace("+", ","), "combine": init.combine}
    elif state is not None and args.init_from is not None:
        settings |= {k: state["args"][k] for k in ("dim", "model", "combine")}
    if args.scramble_rate is None:
        lstm = any(pool != "mean" for pool, _ in model_parts(settings["model"]))
        settings["scramble_rate"] = 0.3 if lstm else 0.0
    for k in ("train_shards", "distill", "relate", "dev_file"):
        settings[k] = tuple(settings[k]) if settings[k] is not None else None
    return Config(**ranks.settings(settings))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(
        "Train a sentence encoder (SP by default) with the margin loss and mega-batch hard negatives.",
        "paraphrastic-train --train-file pairs.tsv.gz --output-dir runs/sp --vocab-size 8000 --max-steps 2000\n"
        "On caption paraphrases keep --megabatch-size small (1 was best on Multi30k captions): large mega-batches\n"
        "mine captions of near-identical images as negatives and training collapses.",
        prog="paraphrastic-train",
    )
    data = p.add_mutually_exclusive_group()  # required, with --output-dir: checked below, so one error names both
    data.add_argument("--train-file", type=Path, help="TSV of sentence pairs s1<TAB>s2 (.gz accepted); required, or:")
    data.add_argument("--train-shards", nargs="+", metavar="DIR_OR_FILE", help="HDF5 shards from preprocess/")
    p.add_argument("--output-dir", type=Path, help="model.pt, best.pt, resume.pt, metrics.jsonl (required)")
    p.add_argument(
        "--mode",
        choices=["paraphrase", "bitext"],
        default="paraphrase",
        help="bitext: negatives only from the other language (default: paraphrase)",
    )
    p.add_argument(
        "--model",
        default="sp",
        type=model_spec,
        help="encoder: sp (default), word, trigram, lstm, blstm, gran (recurrent, over sentencepiece pieces), "
        "lstm-word, blstm-word, gran-word; several joined by commas (e.g. word,trigram) are trained jointly, "
        "see --combine",
    )
    p.add_argument(
        "--combine",
        choices=["add", "concat"],
        default="add",
        help="how the vectors of several --model parts make one: add (same dim) or concat (default add)",
    )
    p.add_argument(
        "--scramble-rate",
        type=float,
        help="shuffle a training sentence's token order with this probability (default 0.3 for LSTMs, else 0)",
    )
    p.add_argument(
        "--max-types", type=at_least(1), default=200_000, help="vocabulary of word and trigram models (default 200000)"
    )
    p.add_argument(
        "--sp-model",
        type=Path,
        help="sentencepiece model (default: with --train-shards the sp.model beside them, else one trained on the pairs)",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        help="start from this model's tokenizer and embedding table (any model load_model reads; sets --dim)",
    )
    p.add_argument(
        "--vocab-size", type=at_least(8), default=50000, help="pieces when training sentencepiece (default 50000)"
    )
    p.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lowercase text before sentencepiece (default: yes; shards record their own)",
    )
    p.add_argument("--dim", type=at_least(1), default=1024, help="embedding dimension (default 1024)")
    p.add_argument("--batch-size", type=at_least(1), default=128, help="pairs per update (default 128)")
    p.add_argument(
        "--megabatch-size", type=at_least(1), default=100, help="M: mini-batches pooled for mining (default 100)"
    )
    p.add_argument(
        "--megabatch-anneal",
        type=at_least(0),
        default=150,
        help="grow M by 1 every this many updates, from 1; 0: M from the start (default 150)",
    )
    p.add_argument("--epochs", type=at_least(1), default=25, help="passes over the data (default 25)")
    p.add_argument("--max-steps", type=at_least(1), help="stop after this many updates")
    p.add_argument("--lr", type=float, default=0.001, help="Adam learning rate (default 0.001)")
    p.add_argument("--delta", type=float, default=0.4, help="margin (default 0.4)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout on the piece embeddings")
    p.add_argument("--grad-clip", type=float, help="clip the gradient's L2 norm to this (default off)")
    p.add_argument(
        "--mine-precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="precision of the mining matrix products; auto: bf16 where the hardware does it natively "
        "(CUDA, CPUs with AVX512-BF16 or AMX), fp32 elsewhere, where bf16 is emulated and slower (default auto)",
    )
    p.add_argument("--one-sided", action="store_true", help="negatives only for the source side (eq. 1)")
    p.add_argument(
        "--distill",
        nargs=2,
        type=Path,
        metavar=("SENTENCES", "TARGETS"),
        help="add a distillation loss: pull each sentence's vector toward its row of TARGETS (.npy, one "
        "row per line of SENTENCES, e.g. from teacher.py)",
    )
    p.add_argument("--distill-weight", type=float, default=1.0, help="weight of the distillation loss (default 1)")
    p.add_argument(
        "--distill-relational",
        type=float,
        default=0.0,
        help="weight of a loss matching the batch's cosine matrix to the teacher's (default 0: off)",
    )
    p.add_argument(
        "--distill-contrastive",
        type=float,
        default=0.0,
        help="weight of an in-batch InfoNCE loss: each sentence nearest its own target among the batch's "
        "(default 0: off; the English default model uses 20)",
    )
    p.add_argument(
        "--distill-temperature",
        type=at_least(0.001, float),
        default=0.1,
        help="temperature of --distill-contrastive's cosines (default %(default)s)",
    )
    p.add_argument(
        "--distill-neighbours",
        type=at_least(0),
        metavar="K",
        default=0,
        help="make each distillation batch of anchors and each one's K nearest sentences by the teachers' "
        "targets in a random pool of --distill-pool (hard negatives for --distill-contrastive; default 0: random "
        "batches)",
    )
    p.add_argument(
        "--distill-pool",
        type=at_least(1),
        metavar="N",
        default=4096,
        help="sentences a batch's neighbours are mined from (default %(default)s)",
    )
    p.add_argument(
        "--distill-soft",
        type=at_least(0.0, float),
        metavar="T",
        default=0.0,
        help="--distill-contrastive's labels: the teachers' own distribution over the batch at this temperature "
        "(default 0: one-hot; the English default model uses 0.05 with --distill-neighbours 3)",
    )
    p.add_argument(
        "--distill-batch-size", type=at_least(1), help="sentences per distillation batch (default: --batch-size)"
    )
    p.add_argument(
        "--relate",
        nargs=2,
        type=Path,
        metavar=("SENTENCES", "VECTORS"),
        help="add a relational loss on other sentences, toward another teacher's cosines: VECTORS (.npy, one row "
        "per line of SENTENCES, any dimension, that teacher's own space) set only how the sentences of a batch "
        "relate to each other, not where they lie (batches of --distill-batch-size)",
    )
    p.add_argument("--relate-weight", type=float, default=1.0, help="weight of the --relate loss (default 1)")
    p.add_argument("--margin-weight", type=float, default=1.0, help="weight of the margin loss (default 1)")
    p.add_argument(
        "--on-nan",
        choices=["stop", "skip"],
        default="stop",
        help="a NaN/inf loss or gradient: stop, keeping the last good checkpoint (exit 3), or skip the batch",
    )
    p.add_argument("--save-every", type=at_least(0), default=0, help="also save every N updates (default: each epoch)")
    p.add_argument(
        "--log-every", type=at_least(1), default=100, help="metrics.jsonl line every N updates (default 100)"
    )
    p.add_argument(
        "--dev-file",
        type=Path,
        nargs="+",
        default=[],
        help="STS dev files (score<TAB>s1<TAB>s2): Pearson at each save, best.pt by their mean",
    )
    p.add_argument("--skip-bad-lines", action="store_true", help="skip malformed training lines instead of failing")
    p.add_argument("--seed", type=int, default=1, help="seed of the initialisation, data order and dropout")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --output-dir")
    p.add_argument(
        "--force-resume",
        action="store_true",
        help="with --resume: accept training, distillation, tokenizer or init files other than the saved run's "
        "(the training data must hold as many pairs)",
    )
    p.add_argument("--threads", type=at_least(1), default=None, help="CPU threads (default: the idle cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (the run's lines and metrics.jsonl stay)")
    distributed.add_arguments(p)  # --global-megabatch, --dist-backend
    args = p.parse_args(argv)
    missing = [name for name, given in (("--train-file (or --train-shards)", args.train_file or args.train_shards),
                                        ("--output-dir", args.output_dir)) if not given]  # fmt: skip
    if missing:
        p.error(f"{' and '.join(missing)} required")
    for name in ("dim", "batch_size", "megabatch_size", "epochs", "vocab_size", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch_size < 2:
        p.error("--batch-size must be at least 2 (negatives come from the batch)")
    if not 0.0 <= args.dropout < 1.0:
        p.error("--dropout must be in [0, 1)")
    if not 0.0 <= (args.scramble_rate or 0.0) <= 1.0 or args.max_types < 1:
        p.error("--scramble-rate must be in [0, 1] and --max-types at least 1")
    return args


PART_NAMES = {
    "sp": ("mean", "sp"),
    "word": ("mean", "word"),
    "trigram": ("mean", "trigram"),
    **{f"{lstm}{suffix}": (lstm, tokens or "sp") for lstm in ("lstm", "blstm", "gran") for suffix, tokens in
       (("", None), ("-sp", "sp"), ("-word", "word"), ("-trigram", "trigram"))},
}  # fmt: skip


def model_spec(text: str) -> str:
    """--model as a canonical comma-separated list of part names (an argparse type)."""
    names = [n.strip().lower() for n in text.split(",")]
    unknown = [n for n in names if n not in PART_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown encoder {unknown[0]!r}; choose from {', '.join(PART_NAMES)}")
    return ",".join(names)


def model_parts(spec: str) -> list[tuple[str, str]]:
    """(pooling, tokens) of each part of a --model spec."""
    return [PART_NAMES[n] for n in spec.split(",")]


def check_inputs(args: argparse.Namespace) -> None:
    """Fail before any work (or output) when an input file is missing or a dev file does not parse, or when one of
    the run's outputs in --output-dir is one of its inputs (--init-from run/model.pt --output-dir run)."""
    files = [args.train_file, args.sp_model, *args.dev_file, *(args.distill or []), *(args.relate or [])]
    for path in files:
        if path is not None:
            open_input(path)
    for path in args.dev_file:
        evaluate.read_sts_pairs(path)  # a bad line fails now, not at the first save
    shards = shard_paths(args.train_shards) if args.train_shards else []
    init = model_path(args.init_from) if args.init_from else None
    for name in OUTPUTS:
        refuse_same_file(args.output_dir / name, init, *files, *shards)


def load_resume_state(out: Path) -> dict:
    """The training state of the run in `out`, checked for its format and the parts resuming reads."""
    path = out / "resume.pt"
    if not path.exists():
        raise InputError(f"{path}: no training state to resume (run without --resume to start)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable state is one clear error
        raise InputError(f"{path}: not a readable training state ({str(e).splitlines()[0]})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InputError(f"{path}: not a training state written by train.py")
    version = state.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= STATE_VERSION:
        raise InputError(
            f"{path}: training state format {version!r}; this paraphrastic reads versions up to {STATE_VERSION} "
            "(a newer version wrote it: upgrade paraphrastic to resume it)"
        )
    wrong = [k for k, kind in STATE_PARTS.items() if not isinstance(state.get(k), kind)]
    position, optimizer = state.get("position"), state.get("optimizer")
    if isinstance(position, dict) and not all(
        isinstance(position.get(k), int) and position[k] >= 0 for k in ("step", "epoch", "offset", "inner")
    ):
        wrong.append("position")
    if isinstance(optimizer, dict) and not (
        isinstance(optimizer.get("steps"), int) and isinstance(optimizer.get("moments"), torch.Tensor)
    ):
        wrong.append("optimizer")
    if not isinstance(state.get("megabatch_pairs", 0), int) or not isinstance(state.get("skipped", 0), int):
        wrong.append("megabatch_pairs or skipped")
    if wrong:
        raise InputError(f"{path}: damaged training state (missing or malformed: {', '.join(wrong)}); {START_OVER}")
    return state


def check_resume_args(config: Config, state: dict, out: Path) -> None:
    """Refuse to resume with settings or inputs other than the saved run's, naming each one that differs."""
    saved = LATER_SETTINGS | state["args"]
    changed = [k for k in FIXED_ON_RESUME if saved.get(k) != getattr(config, k)]
    if not config.force_resume:
        changed += [k for k in INPUTS_ON_RESUME if same_inputs(saved.get(k)) != same_inputs(getattr(config, k))]
    if changed:
        diff = ", ".join(f"--{k.replace('_', '-')} {saved.get(k)} -> {config.plain()[k]}" for k in changed)
        hint = "" if config.force_resume else "; --force-resume accepts other input files"
        raise InputError(f"{out / 'resume.pt'}: cannot resume with different settings ({diff}){hint}")


def fingerprint(path: Path) -> str:
    """A file's size and the sha256 of its whole content (streamed: seconds for 10 GB)."""
    return f"{path.stat().st_size}:sha256:{file_digest(path)}"


def same_content(saved: str, now: str) -> bool:
    """Whether two fingerprints name the same content; a run saved before whole-content hashes is compared by size."""
    return saved == now if ":sha256:" in saved else saved.split(":")[0] == now.split(":")[0]


def input_fingerprints(config: Config) -> dict[str, str]:
    """The fingerprint of each training input file, by path, saved in resume.pt and compared on --resume."""
    paths = [config.train_file, *(config.train_shards or ()), *(config.distill or ()), *(config.relate or ())]
    return {str(p): fingerprint(Path(p)) for p in paths if p is not None and Path(p).is_file()}


def check_inputs_unchanged(config: Config, state: dict, out: Path) -> None:
    """Refuse to resume on input files whose content changed since they were saved (same path, other data),
    unless --force-resume."""
    saved = state.get("inputs")
    if not isinstance(saved, dict) or config.force_resume:
        return
    now = input_fingerprints(config)
    changed = [path for path, value in saved.items() if path in now and not same_content(str(value), now[path])]
    if changed:
        raise InputError(
            f"{out / 'resume.pt'}: {', '.join(changed)} changed since the run was saved (same name, other content); "
            "resume on the original file, or pass --force-resume to go on with the new one"
        )


def same_inputs(value):
    """An input argument in a form that compares equal for the same files (absolute paths)."""
    if isinstance(value, list | tuple):
        return [same_inputs(v) for v in value]
    return str(Path(value).resolve()) if isinstance(value, str | Path) else value


def drop_torn_line(path: Path) -> None:
    """Cut an append-only log back to its last complete line (a kill can leave half a line at its end)."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def warn_if_grouped(source, config: Config, sample: int = 20_000) -> None:
    """Warn when mega-batches of M > 1 meet pairs that share sentences (groups of paraphrases, such as several
    captions of one image): the hardest "negative" is then mostly a paraphrase, and such training collapses."""
    if config.megabatch_size <= 1:
        return
    n = min(len(source), sample)
    sentences = [
        flat[start : start + length].tobytes()
        for flat, lengths in source.read(0, n)
        for start, length in zip((np.cumsum(lengths) - lengths).tolist(), lengths.tolist(), strict=True)
    ]
    counts = Counter(sentences)
    shared = sum(counts[s] > 1 for s in sentences) / max(len(sentences), 1)
    if shared > 0.5:
        tqdm.write(
            f"warning: {shared:.0%} of the sentences of the first {n} pairs occur in more than one pair (groups of "
            f"paraphrases, such as captions of one image); with M > 1 their hardest negatives are mostly "
            f"paraphrases and training collapses (docs/training.md): consider --megabatch-size 1"
        )


def sentencepiece_tokenizer(config: Config, out: Path, threads: int, lowercase: bool) -> Tokenizer:
    """The --sp-model, or one trained on the pairs and saved as sp.model."""
    if config.sp_model is not None:
        return Tokenizer(read_sp_model(config.sp_model), lowercase)
    next(iter_pairs(config.train_file, config.skip_bad_lines), None)  # a bad first line is named before the wait
    tqdm.write(f"training a sentencepiece model ({config.vocab_size} pieces) on {config.train_file}")
    sp = sentencepiece_from_text(config.train_file, config.vocab_size, lowercase, config.skip_bad_lines, threads, out)
    with atomic_output(out / "sp.model") as f:
        f.write(sp)
    tokenizer = Tokenizer(sp, lowercase)
    if len(tokenizer) < config.vocab_size:
        tqdm.write(
            f"note: sentencepiece made {len(tokenizer)} pieces, not the {config.vocab_size} asked: the training "
            "text holds no more distinct pieces (more text gives more; a smaller --vocab-size says what you get)"
        )
    return tokenizer


def new_model(config: Config, out: Path, threads: int, lowercase: bool, sp: Tokenizer | None = None) -> Model:
    """A fresh --model: its tokenizers (sentencepiece given or trained, word and trigram vocabularies counted
    on the pairs), a table drawn from N(0, 1) with the run's seed (as the reference), seeded LSTM weights."""
    parts = model_parts(config.model)
    tokenizers = []
    for _, tokens in parts:
        if tokens == "sp":
            sp = sp or sentencepiece_tokenizer(config, out, threads, lowercase)
            tokenizers.append(sp)
        else:
            tqdm.write(f"counting the {tokens}s of {config.train_file} (top {config.max_types} kept)")
            texts = (src + tgt for src, tgt in iter_pairs(config.train_file, config.skip_bad_lines))
            tokenizers.append(TOKENIZERS[tokens](build_vocab(tokens, texts, config.max_types, lowercase), lowercase))
    table = torch.randn(sum(map(len, tokenizers)), config.dim, generator=torch.Generator().manual_seed(config.seed))
    if parts == [("mean", "sp")]:
        return SPModel(tokenizers[0], table, {"source": "train.py"})
    torch.manual_seed(config.seed)  # the LSTMs' initial weights
    return Model(tokenizers, [pool for pool, _ in parts], table, {"source": "train.py"}, config.combine)


def model_and_source(config: Config, state: dict | None, out: Path, threads: int, init: Model | None):
    """The model (resumed, from --init-from, or new) and the source of its tokenized pairs."""
    model = from_checkpoint(state["model"], out / "resume.pt") if state is not None else init
    if config.train_shards:
        paths = shard_paths(config.train_shards)
        tokens = model_parts(config.model)
        if len(tokens) != 1 or tokens[0][1] != "sp":
            raise InputError(f"--train-shards hold sentencepiece ids; a {config.model} model trains from --train-file")
        sp = model.sp_tokenizer.sp_model if model else read_sp_model(config.sp_model or shards_sp_model(paths[0]))
        source = ShardSet(paths, sp)
        if config.lowercase is not None and config.lowercase != source.lowercase:
            raise InputError(f"{paths[0]}: the shards were encoded with lowercase={source.lowercase}")
        return model or new_model(config, out, threads, source.lowercase, Tokenizer(sp, source.lowercase)), source
    open_input(config.train_file)
    model = model or new_model(config, out, threads, True if config.lowercase is None else config.lowercase)
    tqdm.write(f"tokenizing {config.train_file}")
    return model, tokenize_pairs(config.train_file, model, config.skip_bad_lines, threads)


def shards_sp_model(shard: Path) -> Path:
    """The sentencepiece model that preprocess/ wrote beside the shards (in their folder or its parent)."""
    for folder in (shard.parent, shard.parent.parent):
        if (folder / "sp.model").is_file():
            return folder / "sp.model"
    raise InputError(f"{shard}: no sp.model beside the shards; pass --sp-model, the model they were encoded with")


def load_init_model(path: Path | None, sp_model: Path | None) -> Model | None:
    """The --init-from model (its dimension, parts and combination become the run's), starting with a
    config of its structure only."""
    if path is None:
        return None
    if sp_model is not None:
        raise InputError("--init-from brings its own tokenizers: drop --sp-model")
    init = load_model(path)
    if getattr(init, "piece_rows", None) is not None:
        raise InputError(f"{path}: an original-release model cannot be trained on; load and save it first")
    state = init.checkpoint()
    state["config"] = {k: v for k, v in state["config"].items() if k in STRUCTURE} | {"source": "train.py"}
    return from_checkpoint(state, path)


@run_cli
def main(argv: list[str] | None = None, on_step: Callable[[Trainer], None] | None = None) -> int:
    """Train (or resume) a model; returns the exit status. `on_step(trainer)` runs after every update
    (tests use it to interrupt or kill a run at a given step)."""
    args = parse_args(argv)
    ranks, device = distributed.join(args.device, args.dist_backend)  # torchrun's process group, if any
    check_inputs(args)
    resolve_device(device)  # a missing CUDA device is refused before the output folder is made
    args.output_dir.mkdir(parents=True, exist_ok=True)
    with lock_folder(args.output_dir) if ranks.is_main else contextlib.nullcontext():  # one run per folder
        return run(args, device, on_step, ranks)


def run(args: argparse.Namespace, device: str, on_step: Callable[[Trainer], None] | None, ranks: Ranks) -> int:
    """Set up the run in --output-dir (new, resumed or from --init-from) and train it."""
    out = args.output_dir
    for name in OUTPUTS:
        remove_stale_temps(out / name)  # left by a killed run
    state = load_resume_state(out) if args.resume else None
    if state is None and (out / "resume.pt").exists():
        raise InputError(f"{out}: already holds a training run; pass --resume to continue it or use another directory")
    init = load_init_model(args.init_from, args.sp_model) if state is None else None
    config = make_config(args, device, state, init, ranks)
    if state is not None:
        check_resume_args(config, state, out)
        check_inputs_unchanged(config, state, out)
    threads = use_threads(config.threads)
    device = resolve_device(config.device)
    with ranks.rank_zero_first(config) as setup:  # rank 0 trains sentencepiece, the others reuse it
        model, source = model_and_source(setup, state, out, threads, init)
    if len(source) < 2:
        raise InputError(f"{config.train_file or config.train_shards[0]}: need at least 2 training pairs")
    torch.manual_seed(config.seed)
    model = model.to(device)
    trainer = Trainer(config, model, PairSampler(source, config.seed), on_step, ranks)
    trainer.quiet = args.quiet
    if state is not None:
        try:
            trainer.load_state_dict(state)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as e:
            what = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            raise InputError(f"{out / 'resume.pt'}: damaged training state ({what}); {START_OVER}") from None
        drop_torn_line(out / "metrics.jsonl")
        if ranks.is_main:
            tqdm.write(f"resuming from step {trainer.step} of {out}")
    ranks.share(trainer)  # this rank's share of the data from here on
    if ranks.is_main:  # one header for the run, not one per process
        ends = f" (--epochs {config.epochs} end first)" if trainer.total_steps < (config.max_steps or 0) else ""
        tqdm.write(
            f"training {len(source)} pairs: {model.kind} model, dim {model.dim}, {model.embedding.num_embeddings} "
            f"rows, batch {config.batch_size}, M up to {config.megabatch_size}, {trainer.total_steps} updates{ends}, "
            f"{device}, mining in {str(trainer.mine_dtype).removeprefix('torch.')}"
        )
        warn_if_grouped(source, config)
    code = trainer.train()
    if ranks.is_main and code == 0:
        best = f"; best dev checkpoint {out / 'best.pt'}" if (out / "best.pt").exists() else ""
        tqdm.write(f"saved {out / 'model.pt'} (after update {trainer.step}){best}")
    return code


if __name__ == "__main__":
    sys.exit(main())
