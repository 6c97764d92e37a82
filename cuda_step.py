"""A training step that never waits on the GPU and wastes no work on filler: each mini-batch's ids and distinct
rows in slots sized from counts made once a mega-batch (distinct_rows, slots), pooling and its gradient as bag
sums in one fixed order (segment_mean: the same bits every run, no atomics queueing on a filler row), one layout of
a mini-batch for the device, its graph and the host (minibatch_sentences), and the step recorded once per shape as a
CUDA graph and replayed (GraphedSteps)."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm


def slots(count: int) -> int:
    """`count` rounded up to one of eight sizes per power of two: at most an eighth filler, and few shapes (each
    shape is a CUDA graph)."""
    grain = 1 << max(count.bit_length() - 4, 0)
    return -(-count // grain) * grain


class Distinct(NamedTuple):
    """A batch's ids as distinct table rows, in a size fixed beforehand (a CUDA graph's shapes cannot follow the
    data): `rows` holds the distinct ids ascending, then the spare row as filler; id i is rows[local[i]]; the ids
    of slot k are order[starts[k] : starts[k + 1]] (positions sorted by id, equal ids in their order)."""

    rows: torch.Tensor
    local: torch.Tensor
    order: torch.Tensor
    starts: torch.Tensor


def distinct_rows(ids: torch.Tensor, spare: int, size: int, real: torch.Tensor | None = None) -> Distinct:
    """The Distinct of `ids` in `size` slots (at least the distinct count, plus one where padding follows). `real`:
    how many leading ids are real, the rest padding of the spare row (the largest id): its slot is left empty, so
    that the padding adds nothing to any gradient."""
    ordered, order = torch.sort(ids, stable=True)
    new = torch.ones_like(ordered, dtype=torch.bool)
    new[1:] = ordered[1:] != ordered[:-1]
    slot = torch.cumsum(new, 0) - 1
    starts = torch.searchsorted(slot, torch.arange(size + 1, device=ids.device))
    if real is not None:
        starts = starts.clamp_max(real)
    filled = starts[:-1] < starts[1:]
    rows = torch.where(filled, ordered[starts[:-1].clamp_max(len(ids) - 1)], spare)
    return Distinct(rows, torch.empty_like(slot).scatter_(0, order, slot), order, starts)


class _BagSums(torch.autograd.Function):
    """Each bag's sum of the rows of `sub` its ids name (ids [bounds[b], bounds[b + 1]) as `local` slots), with
    dropout `p` on those rows. The gradient of a distinct row sums its ids' bags' gradients in the sorted order
    (`order`, segment `starts`), in one fixed order (the same bits every run, no atomics). Without dropout both ways
    are one embedding_bag, which reads the rows where they lie: no ids x dim tensor is written, where a gather then
    a segment sum wrote and read one (the same sums in the same order: the same bits)."""

    @staticmethod
    def forward(ctx, sub, local, order, starts, bounds, p: float):
        owner = torch.searchsorted(bounds, order, right=True) - 1  # each id's bag; padding's: the bag past the last
        ctx.p, mask = p, None
        if p > 0:
            rows, mask = torch.native_dropout(sub.index_select(0, local), p, True)
            sums = torch.segment_reduce(rows, "sum", offsets=bounds, unsafe=True)
        else:  # the ids past bounds[-1] make one more bag, the padding's, dropped
            sums = F.embedding_bag(local, sub, bounds, mode="sum")[:-1]
        ctx.save_for_backward(owner, order, starts, mask)
        return sums

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        owner, order, starts, mask = ctx.saved_tensors
        grad = F.pad(grad, (0, 0, 0, 1))  # the padding's bag: no gradient
        if mask is None:  # slot k: ids [starts[k], starts[k + 1]); the last slot's bag runs on into the padding
            return F.embedding_bag(owner, grad, starts[:-1], mode="sum"), None, None, None, None, None
        spread = grad.index_select(0, owner)  # each id's gradient, in the sorted order
        spread = torch.ops.aten.native_dropout_backward(spread, mask.index_select(0, order), 1 / (1 - ctx.p))
        return torch.segment_reduce(spread, "sum", offsets=starts, unsafe=True), None, None, None, None, None


def segment_mean(sub: torch.Tensor, distinct: Distinct, bounds: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
    """The mean of each bag of rows of `sub` (the distinct rows' vectors): bag b holds ids [bounds[b], bounds[b +
    1]); ids past bounds[-1] (padding) are read by none. mean_pool's result, by bag sums in a fixed order both
    ways, with nothing read back to the host."""
    sums = _BagSums.apply(sub, *distinct[1:], bounds, dropout)
    return sums / torch.diff(bounds).clamp_min(1).unsqueeze(1).to(sums.dtype)


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
    """Mini-batch updates of fixed shapes, recorded once as CUDA graphs and replayed: a step then costs the host one
    launch instead of a hundred, which is what a GPU's step at batch 128 waits for otherwise.

    Each mega-batch is copied into buffers that keep their addresses, and each of its mini-batches' ids and distinct
    rows are counted there at once (one read back, with the negatives'). A step reads its pairs from the buffers by
    its start (a one-number buffer), pads its ids with a last bag of the spare row that no loss reads, and takes its
    shape, ids and rows, from `slots` of its own counts. The first step of each shape runs directly (warming the
    kernels up) and is then recorded, every graph in one memory pool; where recording fails, or off a GPU (the
    tests), every step runs that same code directly.
    """

    def __init__(self, trainer):  # train.Trainer, whose optimizer, margin and apply_on_device a step uses
        self.trainer, self.device = trainer, trainer.device
        self.record = trainer.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.record else None
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.seen: set[tuple[int, int]] = set()  # every shape run so far (recorded or not)
        self.loaded = None  # the train.MegaBatch in the buffers
        self.shapes: list[tuple[int, int]] = []  # each full mini-batch's (id slots, row slots)
        self.shape, self.capacity = (0, 0), 0
        self.numbers = torch.zeros(3, dtype=torch.int64, device=self.device)  # start, n, where the padding sits
        self.loss = torch.zeros((), device=self.device)

    def step(self, mb, lo: int, hi: int) -> torch.Tensor | None:
        """The update of mini-batch [lo, hi) of `mb` (its loss), or None for train_step to do (a short one)."""
        batch = self.trainer.config.batch_size
        if hi - lo != batch:
            return None
        if mb is not self.loaded:
            self.load(mb)
        self.numbers[0].fill_(lo)
        self.shape = self.shapes[lo // batch]
        graph = self.graphs.get(self.shape)
        if graph is not None:
            graph.replay()
        else:
            new, began = self.shape not in self.seen, time.perf_counter()
            self.first_run()
            if new:  # a shape's first run, and on a GPU its recording: bench_gpu reports their count and time
                self.seen.add(self.shape)
                self.trainer.seconds["record"] += time.perf_counter() - began
        return self.loss.clone()

    def load(self, mb) -> None:
        """Copy a new mega-batch into the buffers (grown, and the graphs dropped, when it does not fit) and fix the
        shape of each of its steps."""
        self.shapes = [(slots(ids), slots(rows + 1)) for ids, rows in zip(*self.counts(mb), strict=True)]
        most = max((size for size, _ in self.shapes), default=1)
        ids, n2 = len(mb.sentences.ids), 2 * mb.n
        if ids + most > self.capacity or n2 > len(getattr(self, "offsets", ())):
            self.capacity = 1 << (ids + most).bit_length()
            self.ids = torch.empty(self.capacity, dtype=torch.int64, device=self.device)
            self.offsets, self.lengths, self.negatives = (
                torch.empty(1 << n2.bit_length(), dtype=torch.int64, device=self.device) for _ in range(3)
            )
            self.positions = torch.arange(max(self.capacity, len(self.offsets)), device=self.device)
            self.graphs = {}
        self.ids[:ids].copy_(mb.sentences.ids)
        self.ids[ids : ids + most].fill_(self.trainer.optimizer.rows)  # the padding: the spare row
        self.offsets[:n2].copy_(mb.sentences.offsets)
        self.lengths[:n2].copy_(mb.lengths)
        self.negatives[:n2].copy_(mb.negatives)
        self.numbers[1].fill_(mb.n)
        self.numbers[2].fill_(ids)
        self.loaded = mb

    def counts(self, mb) -> list[list[int]]:
        """(ids, distinct ids) of each full mini-batch of `mb`, counted on the device for all of them at once."""
        batch, spare = self.trainer.config.batch_size, self.trainer.optimizer.rows
        steps = mb.n // batch
        idx, _ = minibatch_sentences(torch.arange(steps * batch, device=self.device), mb.n, mb.negatives,
                                     self.trainer.config.one_sided)  # fmt: skip
        step_of = torch.arange(len(idx), device=self.device) % (steps * batch) // batch
        owner = torch.repeat_interleave(step_of, mb.lengths[idx])
        keys = torch.unique(owner * (spare + 1) + mb.sentences.take(idx, mb.lengths).ids)
        found = [torch.bincount(owner, minlength=steps), torch.bincount(keys // (spare + 1), minlength=steps)]
        return torch.stack(found).tolist()

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
            with torch.cuda.graph(graph, pool=self.pool):
                self.run()
        except RuntimeError as e:  # recording refused: every step runs directly from here on, as on a CPU
            tqdm.write(f"warning: CUDA graphs unavailable ({str(e).splitlines()[0]}); steps run one kernel at a time")
            self.record = False
            return
        self.graphs[self.shape] = graph

    def run(self) -> None:
        """The step itself, in this step's shape: MegaBatch.minibatch's bags padded to the id slots, then
        train_step's pooling, loss and update on the row slots."""
        config, trainer = self.trainer.config, self.trainer
        batch, (size, rows) = config.batch_size, self.shape
        start, n, pad_at = self.numbers[0], self.numbers[1], self.numbers[2]
        idx, negatives = minibatch_sentences(start + self.positions[:batch], n, self.negatives, config.one_sided)
        lens = self.lengths[idx]
        real = lens.sum()
        lens = torch.cat([lens, (size - real).view(1)])  # the padding bag takes the rest
        sources = torch.cat([self.offsets[idx], pad_at.view(1)])
        offsets = torch.cumsum(lens, 0) - lens  # the bags' bounds: the padding bag starts where the real ids end
        ids = self.ids[self.positions[:size] - torch.repeat_interleave(offsets - sources, lens, output_size=size)]
        distinct = distinct_rows(ids, trainer.optimizer.rows, rows, real)
        sub = trainer.optimizer.table.index_select(0, distinct.rows).requires_grad_()
        vectors = segment_mean(sub, distinct, offsets, config.dropout)
        loss = trainer.margin(vectors, [(neg >= 0).float() for neg in negatives])
        loss.backward()
        self.loss.copy_(trainer.apply_on_device(loss, distinct.rows, sub))
