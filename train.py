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

On caption paraphrases keep --megabatch-size small (docs/training.md): a large mega-batch's hardest "negative"
is mostly a caption of a near-identical image, and training collapses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from paraphrastic import distributed, evaluate
from paraphrastic.cli import run_cli
from paraphrastic.cuda_step import GraphedSteps, distinct_rows, minibatch_sentences, segment_mean
from paraphrastic.distill import DistillStream, contrastive_loss, distill_loss, relational_loss
from paraphrastic.distributed import ALONE, Ranks
from paraphrastic.encoders import bag_owners
from paraphrastic.fileio import Error, InputError, atomic_output, lock_folder, make_folder, reporting_full_disk
from paraphrastic.models import Bags, Model, resolve_device
from paraphrastic.negatives import mine_hardest, mining_dtype, sentence_groups
from paraphrastic.optim import LazyAdam, all_finite, clip_gradient
from paraphrastic.pairs import PairData, PairSampler
from paraphrastic.resume import (
    START_OVER,
    STATE_FORMAT,
    STATE_VERSION,
    drop_torn_line,
    input_fingerprints,
)
from paraphrastic.run_setup import check_inputs, start_run, warn_if_grouped
from paraphrastic.train_config import Config, parse_args

SYNC_FREE_ON_CPU = False  # tests set it to run the GPU's step (no waits on the device) on a CPU
EMBED_CHUNK = 8192  # sentences embedded at once when mining (bounds an LSTM's padded batch)
COSINE_EPS = 1e-8  # the floor on a vector's norm in a cosine (F.cosine_similarity's)


# ----------------------------------------------------------------------------- objective


def megabatch_size_at(step: int, max_size: int, anneal: int) -> int:
    """Mini-batches per mega-batch after `step` updates: 1, growing by 1 every `anneal` steps, up to max."""
    if anneal <= 0:
        return max_size
    return min(max_size, 1 + step // anneal)


def margin_loss(
    vectors: torch.Tensor, valid: list[torch.Tensor | None] | torch.Tensor, delta: float = 0.4, weight: float = 1.0
) -> torch.Tensor:
    """`weight` times the mean over pairs of [delta - cos(s, t) + cos(s, t')]_+, plus [delta - cos(s, t) + cos(t,
    s')]_+ in the symmetric form. `vectors`: the sources, their targets, then the sources' negatives and (symmetric
    form) the targets' negatives, as many rows each; `valid`: per anchor (s, then t), 1 where its negative is
    allowed, 0 where the pair adds nothing (None: all allowed), or one tensor of a row per anchor."""
    if not isinstance(valid, torch.Tensor) and any(v is not None for v in valid):
        valid = torch.stack([vectors.new_ones(len(vectors) // (len(valid) + 2)) if v is None else v for v in valid])
    weights = valid if isinstance(valid, torch.Tensor) else None
    return _MarginLoss.apply(vectors, weights, len(valid), delta, weight)


class _MarginLoss(torch.autograd.Function):
    """margin_loss, with its gradient written out: every vector normalized once (F.normalize's, as
    cosine_similarity's values bit for bit) and both negatives' cosines from one product, forward and backward in
    about half the kernels autograd took, where a GPU's step at batch 128 is mostly tiny kernels."""

    @staticmethod
    def forward(ctx, vectors, valid, anchors: int, delta: float, weight: float):
        norm = torch.linalg.vector_norm(vectors, dim=1, keepdim=True)
        scale = norm.clamp_min(COSINE_EPS)
        unit = (vectors / scale).view(anchors + 2, -1, vectors.shape[1])
        positive = (unit[0] * unit[1]).sum(-1)
        hinge = delta - positive + (unit[:anchors] * unit[2:]).sum(-1)  # a row per anchor
        loss = hinge.clamp_min(0) if valid is None else hinge.clamp_min(0) * valid
        ctx.save_for_backward(unit, norm, scale, hinge, valid)
        ctx.weight = weight
        return weight * loss.sum(0).mean()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        unit, norm, scale, hinge, valid = ctx.saved_tensors
        anchors, pairs = hinge.shape
        slope = (hinge >= 0) * (grad * (ctx.weight / pairs))  # each hinge's gradient, (anchors, pairs)
        slope = (slope if valid is None else slope * valid).unsqueeze(-1)
        down = -slope.sum(0)  # cos(s, t) lowers every hinge of its pair
        grads = [down * unit[1] + slope[0] * unit[2], down * unit[0], slope[0] * unit[0]]  # s, t, s's negative
        if anchors == 2:  # t's hinge with t's negative
            grads[1] = grads[1] + slope[1] * unit[3]
            grads.append(slope[1] * unit[1])
        dim = unit.shape[-1]
        grad_unit, unit = torch.cat(grads).view(-1, dim), unit.view(-1, dim)
        along = (grad_unit * unit).sum(-1, keepdim=True) * (norm >= COSINE_EPS)  # a clamped norm passes none
        return (grad_unit - unit * along) / scale, None, None, None, None


def scramble(ids: torch.Tensor, offsets: torch.Tensor, rate: float) -> torch.Tensor:
    """Shuffle the token order of each bag with probability `rate` (the papers' scrambling for LSTMs)."""
    lengths, owner = bag_owners(len(ids), offsets)
    shuffled = torch.rand(len(offsets), device=ids.device) < rate
    position = (torch.arange(len(ids), device=ids.device) - offsets[owner]).double()
    key = torch.where(shuffled[owner], torch.rand(len(ids), device=ids.device, dtype=torch.float64), position)
    order = torch.argsort(key, stable=True)
    return ids[order[torch.argsort(owner[order], stable=True)]]


# ----------------------------------------------------------------------------- training


class MegaBatch:
    """The 2n sentences of n pairs (sources first) on the device, their paraphrase groups where the pairs name them
    (`labels`), and each one's mined negative."""

    def __init__(self, model: Model, data: PairData, device: torch.device):
        self.n = len(data)
        flat = np.concatenate([data.src[0], data.tgt[0]])
        lengths = np.concatenate([data.src[1], data.tgt[1]])
        bags = model.rows_and_offsets(flat, lengths)
        self.host_lengths = bags.lengths().numpy()  # the host's copy: a mini-batch's size without asking the GPU
        self.sentences = bags.to(device)
        self.lengths = self.sentences.lengths()
        self.labels = None if data.groups is None else torch.from_numpy(np.tile(data.groups, 2)).to(device)
        self.negatives: torch.Tensor | None = None
        self.host_negatives: np.ndarray | None = None

    def mine(self, model: Model, bitext: bool, dtype: torch.dtype) -> None:
        """Embed every sentence without dropout and pick each one's hardest negative."""
        with torch.no_grad():
            s = self.sentences
            vectors = torch.cat([model(*s.slice(a, a + EMBED_CHUNK)) for a in range(0, 2 * self.n, EMBED_CHUNK)])
        self.negatives = mine_hardest(vectors, sentence_groups(*self.sentences), bitext, dtype, labels=self.labels)
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
        if self.sync_free:  # one spare row past the table: distinct_rows' filler
            table = torch.cat([table, table.new_zeros(1, table.shape[1])])
            model.embedding.weight.data = table[:-1]
        self.optimizer = LazyAdam(table, config.lr, spare=int(self.sync_free))
        self.bad = torch.zeros((), dtype=torch.int64, device=self.device)  # non-finite updates not yet reported
        self.inputs = input_fingerprints(config)  # saved with the state, compared on --resume
        plain = not (config.distill or config.relate or config.scramble_rate or config.nested_dims)
        plain = plain and model.poolings == ["mean"]  # the graph's step is the margin loss alone
        self.graphs = GraphedSteps(self) if self.sync_free and plain else None
        self.dense_optimizer = torch.optim.Adam(self.dense, lr=config.lr) if self.dense else None
        self.mine_dtype = mining_dtype(config.mine_precision, self.device)
        self.step = self.epoch = self.offset = self.inner = 0
        self.megabatch: MegaBatch | None = None
        self.ahead: tuple[tuple[int, int, int], PairData] | None = None  # the next mega-batch's pairs, read early
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
        # where the time goes; "record": a GPU step's first run in each new shape and its recording (within "update")
        self.seconds = {"read": 0.0, "mine": 0.0, "update": 0.0, "save": 0.0, "record": 0.0}
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
                    if self.inner == m:
                        self.read_ahead(self.offset + mb.n)
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
        start, key = time.perf_counter(), self.megabatch_key(self.offset)
        data = self.ahead[1] if self.ahead is not None and self.ahead[0] == key else self.sampler.read(*key)
        self.ahead = None
        self.megabatch = MegaBatch(self.model, data, self.device)
        read = time.perf_counter()
        self.megabatch.mine(self.model, self.config.mode == "bitext", self.mine_dtype)
        self.megabatch = self.ranks.view(self.megabatch, data)  # this rank's slices, in global positions
        self.seconds["read"] += read - start
        self.seconds["mine"] += time.perf_counter() - read
        return True

    def read_ahead(self, offset: int) -> None:
        """Read the pairs of the mega-batch at `offset` now, at the last update of this one: on a GPU the host then
        reads them while the device still runs the queued updates, where a log right after would first wait for
        them. _next_megabatch takes them (the same pairs it would read: the sampler's order is fixed)."""
        if offset < len(self.sampler):
            start, key = time.perf_counter(), self.megabatch_key(offset)
            self.ahead = key, self.sampler.read(*key)
            self.seconds["read"] += time.perf_counter() - start

    def megabatch_key(self, offset: int) -> tuple[int, int, int]:
        """The sampler's (epoch, offset, pairs) of the mega-batch at `offset` of this epoch, from this step on."""
        m = megabatch_size_at(self.step, self.config.megabatch_size, self.config.megabatch_anneal)
        return self.epoch, offset, m * self.config.batch_size

    def train_step(self, bags: Bags, valid: list[torch.Tensor]) -> float | torch.Tensor | None:
        """One update on a mini-batch: gather the rows it uses, pool, margin loss (plus the distillation
        loss with --distill), row-sparse gradient for the table, dense for LSTM weights."""
        pooled = len(bags.offsets)  # the margin loss's sentences; distillation's follow them
        targets = relations = None
        if self.config.scramble_rate:
            bags = Bags(scramble(*bags, self.config.scramble_rate), bags.offsets)
        if self.distill is not None:
            distilled, targets = self.distill.batch(self.step, self.device)
            bags = bags.cat(distilled)
        if self.relate is not None:
            related, relations = self.relate.batch(self.step, self.device)
            bags = bags.cat(related)
        parts = self.model.split_parts(*bags)
        ids = torch.cat([p[0] for p in parts])
        if self.sync_free:  # rows of a size known beforehand, so that the GPU never reports a count
            distinct = distinct_rows(ids, self.optimizer.rows, len(ids))
            rows, local = distinct.rows, distinct.local
        else:
            rows, local = torch.unique(ids, return_inverse=True)
        sub = self.optimizer.table.index_select(0, rows).requires_grad_()
        local_parts = list(zip(local.split([len(p[0]) for p in parts]), (p[1] for p in parts), strict=True))
        if self.dense_optimizer:
            self.dense_optimizer.zero_grad()
        if self.sync_free and self.model.poolings == ["mean"]:
            offsets = parts[0][1]  # one part: its bags' starts, then the end of its ids
            vectors = segment_mean(
                sub, distinct, torch.cat([offsets, offsets.new_tensor([len(ids)])]), self.config.dropout
            )
        else:
            vectors = self.model.pool_parts(sub, local_parts, self.config.dropout)
        loss = self.losses(vectors, pooled, valid, targets, relations)
        for k in self.config.nested_dims:  # the same losses on each row's first k values, so that cuts keep more
            loss = loss + self.losses(vectors[:, :k], pooled, valid, targets, relations, k)
        loss.backward()
        if self.sync_free:
            return self.apply_on_device(loss, rows, sub)
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

    def losses(
        self,
        vectors: torch.Tensor,
        pooled: int,
        valid: list[torch.Tensor],
        targets: torch.Tensor | None,
        relations: torch.Tensor | None,
        k: int | None = None,
    ) -> torch.Tensor:
        """The step's weighted losses on its vectors: the margin loss on the first `pooled`, distillation on the
        next (toward the targets' first `k` values: the teachers' PCA puts the most variance first), the relational
        loss on the last."""
        loss = self.margin(vectors[:pooled], valid)
        if targets is not None:
            taught, targets = vectors[pooled : pooled + len(targets)], targets[:, :k]
            loss = loss + self.config.distill_weight * distill_loss(taught, targets)
            if self.config.distill_relational:
                loss = loss + self.config.distill_relational * relational_loss(taught, targets)
            if self.config.distill_contrastive:
                loss = loss + self.config.distill_contrastive * contrastive_loss(
                    taught, targets, self.config.distill_temperature, self.config.distill_soft
                )
        if relations is not None:
            loss = loss + self.config.relate_weight * relational_loss(vectors[-len(relations) :], relations)
        return loss

    def margin(self, vectors: torch.Tensor, valid: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """The weighted margin loss of a mini-batch's vectors: sources, targets, then their negatives' (one group of
        the mini-batch's size per entry of `valid`)."""
        return margin_loss(vectors, valid, self.config.delta, self.config.margin_weight)

    def apply_on_device(self, loss: torch.Tensor, rows: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
        """The update of a step that never waits for the GPU, to the table's `rows`, gathered in `sub` (with their
        gradient): the finiteness check, clipping and Adam all stay on the device (a non-finite update is masked
        there and counted in `bad`, read at the next log or save); returns the loss, 0 where masked."""
        grad, total = sub.grad, loss.detach() + sub.grad.sum()  # a NaN or inf in either makes the sum one
        skip = (total - total) != 0  # not finite, in two kernels where isfinite takes four
        self.bad += skip
        if self.config.grad_clip:
            clip_gradient([grad], self.config.grad_clip, on_device=True)
        self.optimizer.step(rows, grad, skip, weights=sub.detach())
        return torch.where(skip, 0, loss.detach())

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
            | {"skipped": self.skipped, "shapes": len(self.graphs.seen) if self.graphs is not None else 0}
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
                self.model.save(
                    self.out / "best.pt",
                    extra_config={**extra, "dev_pearson": dev},
                    precision=self.config.save_precision,
                )
            text = " ".join(f"{Path(k).name}={v:.2f}" for k, v in scores.items())
            tqdm.write(f"step {self.step}: dev Pearson {text} (mean {mean:.2f}{', best' if improved else ''})")
            self._metrics({"event": "dev", "step": self.step, "epoch": self.epoch, "pearson": scores, "mean": mean})
        self._save_state(extra)

    def _save_state(self, extra: dict) -> None:
        """resume.pt (float32 whatever --save-precision says: the run resumes exactly), then model.pt, each written
        atomically."""
        with atomic_output(self.out / "resume.pt") as f:
            torch.save(self.state_dict(), f)
        self.model.save(self.out / "model.pt", extra_config=extra, precision=self.config.save_precision)

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


@run_cli
def main(argv: list[str] | None = None, on_step: Callable[[Trainer], None] | None = None) -> int:
    """Train (or resume) a model; returns the exit status. `on_step(trainer)` runs after every update
    (tests use it to interrupt or kill a run at a given step)."""
    args = parse_args(argv)
    ranks, device = distributed.join(args.device, args.dist_backend)  # torchrun's process group, if any
    check_inputs(args)
    resolve_device(device)  # a missing CUDA device is refused before the output folder is made
    make_folder(args.output_dir)
    with lock_folder(args.output_dir) if ranks.is_main else contextlib.nullcontext():  # one run per folder
        return run(args, device, on_step, ranks)


def run(args: argparse.Namespace, device: str, on_step: Callable[[Trainer], None] | None, ranks: Ranks) -> int:
    """Set up the run in --output-dir (new, resumed or from --init-from) and train it."""
    out = args.output_dir
    config, state, model, source, device = start_run(args, device, ranks)
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
