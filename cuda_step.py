"""A training step that never waits on the GPU and wastes no work on filler: each mini-batch's ids and distinct
rows in slots sized from counts made once a mega-batch (distinct_rows, slots), every step of a mega-batch planned
at once so that a step only reads its row (plan_steps), pooling and its gradient as bag sums in one fixed order
(segment_mean: the same bits every run, no atomics queueing on a filler row), one layout of a mini-batch for the
device, its graph and the host (minibatch_sentences), and the step recorded once per shape as a CUDA graph and
replayed (GraphedSteps)."""

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
    """The Distinct of `ids` in `size` slots (at least the distinct count, plus one where padding follows), or of
    each row of `ids` (2-D: a Distinct of rows). `real`: how many leading ids are real (per row), the rest padding
    of the spare row (the largest id): its slot is left empty, so that the padding adds nothing to any gradient."""
    ordered, order = torch.sort(ids, stable=True)
    new = torch.ones_like(ordered, dtype=torch.bool)
    new[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    slot = torch.cumsum(new, -1) - 1
    starts = torch.searchsorted(
        slot, torch.arange(size + 1, device=ids.device).expand(*ids.shape[:-1], -1).contiguous()
    )
    if real is not None:
        starts = torch.minimum(starts, real.unsqueeze(-1))
    filled = starts[..., :-1] < starts[..., 1:]
    rows = torch.where(filled, ordered.gather(-1, starts[..., :-1].clamp_max(ids.shape[-1] - 1)), spare)
    return Distinct(rows, torch.empty_like(slot).scatter_(-1, order, slot), order, starts)


def gpu_bag_sums(values: torch.Tensor):
    """kernels.bag_sums where `values` lie on a GPU and Triton is at hand, else None (embedding_bag)."""
    if not values.is_cuda:
        return None
    from paraphrastic import kernels

    return kernels.bag_sums if kernels.usable(values) else None


class _BagSums(torch.autograd.Function):
    """Each bag's sum of the rows of `sub` its ids name (ids [bounds[b], bounds[b + 1]) as `local` slots), with
    dropout `p` on those rows. The gradient of a distinct row sums its ids' bags' gradients in the sorted order
    (`order`, segment `starts`), in one fixed order (the same bits every run, no atomics). Without dropout both ways
    are one bag sum, which reads the rows where they lie: no ids x dim tensor is written, where a gather then a
    segment sum wrote and read one. On a GPU with Triton the bag sum is kernels.bag_sums (in its own fixed order),
    elsewhere embedding_bag (the same sums in the same order as the segment sums: the same bits)."""

    @staticmethod
    def forward(ctx, sub, local, order, starts, bounds, owner, p: float):
        ctx.p, mask = p, None
        if p > 0:
            rows, mask = torch.native_dropout(sub.index_select(0, local), p, True)
            sums = torch.segment_reduce(rows, "sum", offsets=bounds, unsafe=True)
        elif (kernel := gpu_bag_sums(sub)) is not None:
            sums = kernel(sub, local, bounds)
        else:  # the ids past bounds[-1] make one more bag, the padding's, dropped
            sums = F.embedding_bag(local, sub, bounds, mode="sum")[:-1]
        ctx.save_for_backward(owner, order, starts, mask)
        return sums

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        owner, order, starts, mask = ctx.saved_tensors
        if mask is None and (kernel := gpu_bag_sums(grad)) is not None:  # slots end where the real ids do
            return kernel(grad.contiguous(), owner, starts, backward=True), None, None, None, None, None, None
        grad = F.pad(grad, (0, 0, 0, 1))  # the padding's bag: no gradient
        if mask is None:  # slot k: ids [starts[k], starts[k + 1]); the last slot's bag runs on into the padding
            return F.embedding_bag(owner, grad, starts[:-1], mode="sum"), None, None, None, None, None, None
        spread = grad.index_select(0, owner)  # each id's gradient, in the sorted order
        spread = torch.ops.aten.native_dropout_backward(spread, mask.index_select(0, order), 1 / (1 - ctx.p))
        return torch.segment_reduce(spread, "sum", offsets=starts, unsafe=True), None, None, None, None, None, None


def segment_mean(
    sub: torch.Tensor,
    distinct: Distinct,
    bounds: torch.Tensor,
    dropout: float = 0.0,
    owner: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """The mean of each bag of rows of `sub` (the distinct rows' vectors): bag b holds ids [bounds[b], bounds[b +
    1]); ids past bounds[-1] (padding) are read by none. mean_pool's result, by bag sums in a fixed order both
    ways, with nothing read back to the host. `owner` (each sorted id's bag) and `lengths` (the bags' sizes, at
    least 1, in sub's dtype): where planned already, as GraphedSteps plans them once a mega-batch."""
    if owner is None:  # the padding's: the bag past the last
        owner = torch.searchsorted(bounds, distinct.order, right=True) - 1
    if lengths is None:
        lengths = torch.diff(bounds).clamp_min(1).to(sub.dtype)
    return _BagSums.apply(sub, *distinct[1:], bounds, owner, dropout) / lengths.unsqueeze(1)


def minibatch_sentences(pairs, n, negatives, one_sided: bool):
    """(positions of a mini-batch's sentences in its mega-batch, the anchors' negatives): the pairs' sources and
    targets, then each anchor's mined negative, its partner where none was allowed. Torch tensors or numpy arrays
    alike, so the GPU's step, its graph and the host's count of its ids share one layout."""
    where, cat = (torch.where, torch.cat) if isinstance(pairs, torch.Tensor) else (np.where, np.concatenate)
    anchors = [pairs] if one_sided else [pairs, pairs + n]
    negs = [negatives[a] for a in anchors]
    fallback = [where(neg >= 0, neg, (a + n) % (2 * n)) for neg, a in zip(negs, anchors, strict=True)]
    return cat([pairs, pairs + n, *fallback]), negs


class Plan(NamedTuple):
    """Every full mini-batch of a mega-batch, made ready for its step at once: step k's row of `ints` holds its
    ids' slots (local), their sorted order and bags (owner), the slots' starts and distinct rows, and its bags'
    bounds; its row of `floats` the anchors' validity and its bags' sizes (widths: `layout`). A step reads them
    with two gathers, where building them itself took some fifty small kernels."""

    ints: torch.Tensor
    floats: torch.Tensor

    @staticmethod
    def layout(ids: int, rows: int, batch: int, anchors: int) -> tuple[list[int], list[int]]:
        """The widths of the ints' columns (local, order, owner, starts, rows, bounds) and of the floats' (validity,
        sizes), for mini-batches of `batch` pairs with `anchors` (1 or 2) mined negatives each."""
        bags = (2 + anchors) * batch
        return [ids, ids, ids, rows + 1, rows, bags + 1], [anchors * batch, bags]


class StepSentences(NamedTuple):
    """A mega-batch's full mini-batches, a row each: their anchors' validity, their sentences' lengths
    (minibatch_sentences' layout) and ids (`real` a row; `flat` all of them in order, `step` each one's row)."""

    valid: torch.Tensor
    lens: torch.Tensor
    real: torch.Tensor
    flat: torch.Tensor
    step: torch.Tensor


def step_sentences(mb, batch: int, one_sided: bool) -> StepSentences:
    """The StepSentences of `mb`'s full mini-batches of `batch` pairs, made once for count_steps and plan_steps."""
    steps, device = mb.n // batch, mb.lengths.device
    idx, negatives = minibatch_sentences(torch.arange(steps * batch, device=device), mb.n, mb.negatives, one_sided)
    idx = idx.view(-1, steps, batch).transpose(0, 1).reshape(steps, -1)  # a step's sentences in its own layout
    valid = torch.stack(negatives).view(-1, steps, batch).transpose(0, 1).reshape(steps, -1) >= 0
    lens = mb.lengths[idx]
    real = lens.sum(1)
    flat = mb.sentences.take(idx.flatten(), mb.lengths).ids
    step = torch.repeat_interleave(torch.arange(steps, device=device), real, output_size=len(flat))
    return StepSentences(valid, lens, real, flat, step)


def count_steps(sentences: StepSentences, spare: int) -> list[list[int]]:
    """(ids, distinct ids) of each step, counted on the device at once and read back: what fixes its slots."""
    steps = len(sentences.real)
    keys = torch.unique(sentences.step * (spare + 1) + sentences.flat)
    found = [sentences.real, torch.bincount(keys // (spare + 1), minlength=steps)]
    return torch.stack(found).tolist()


def plan_steps(sentences: StepSentences, spare: int, ids: int, rows: int) -> Plan:
    """The Plan of the steps, in columns `ids` and `rows` wide (at least each step's slots). Each step's values
    equal those distinct_rows and segment_mean compute for it alone: its ids sorted in a row of their own, padded
    with the spare row, which sorts last."""
    valid, lens, real, flat, step = sentences
    bounds = torch.cat([torch.cumsum(lens, 1) - lens, real.unsqueeze(1)], 1)  # the padding's bag starts at `real`
    column = torch.arange(len(flat), device=flat.device) - (torch.cumsum(real, 0) - real)[step]
    padded = torch.full((len(real), ids), spare, dtype=flat.dtype, device=flat.device).index_put_((step, column), flat)
    distinct = distinct_rows(padded, spare, rows, real)
    owner = torch.searchsorted(bounds, distinct.order, right=True) - 1
    ints = torch.cat([distinct.local, distinct.order, owner, distinct.starts, distinct.rows, bounds], 1)
    return Plan(ints, torch.cat([valid.float(), lens.clamp_min(1).float()], 1))


class GraphedSteps:
    """Mini-batch updates of fixed shapes, recorded once as CUDA graphs and replayed: a step then costs the host one
    launch instead of a hundred, which is what a GPU's step at batch 128 waits for otherwise.

    Each mega-batch's mini-batches' ids and distinct rows are counted on the device at once (count_steps, one read
    back), which fixes each step's shape (`slots` of its counts), and then planned at once into buffers that keep
    their addresses (plan_steps): each step's ids padded with a last bag of the spare row that no loss reads, their
    distinct rows, bags and order. A step reads its row of the plan by its index (a one-number buffer). The first step of each
    shape runs directly (warming the kernels up) and is then recorded, every graph in one memory pool; where
    recording fails, or off a GPU (the tests), every step runs that same code directly.
    """

    def __init__(self, trainer):  # train.Trainer, whose optimizer, margin and apply_on_device a step uses
        self.trainer, self.device = trainer, trainer.device
        self.record = trainer.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.record else None
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.seen: set[tuple[int, int]] = set()  # every shape run so far (recorded or not)
        self.loaded = None  # the train.MegaBatch in the buffers
        self.shapes: list[tuple[int, int]] = []  # each full mini-batch's (id slots, row slots)
        self.shape, self.capacity = (0, 0), (0, 0, 0)  # the plan's steps, id and row columns
        self.plan: Plan | None = None
        self.widths: tuple[list[int], list[int]] = ([], [])  # Plan.layout of the buffers
        self.index = torch.zeros(1, dtype=torch.int64, device=self.device)  # the step's row of the plan
        self.loss = torch.zeros((), device=self.device)

    def step(self, mb, lo: int, hi: int) -> torch.Tensor | None:
        """The update of mini-batch [lo, hi) of `mb` (its loss), or None for train_step to do (a short one)."""
        batch = self.trainer.config.batch_size
        if hi - lo != batch:
            return None
        if mb is not self.loaded:
            self.load(mb)
        self.index.fill_(lo // batch)
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
        """Plan a new mega-batch's steps into the buffers (grown, and the graphs dropped, when it does not fit) and
        fix the shape of each."""
        config, spare = self.trainer.config, self.trainer.optimizer.rows
        sentences = step_sentences(mb, config.batch_size, config.one_sided)
        self.shapes = [(slots(i), slots(r + 1)) for i, r in zip(*count_steps(sentences, spare), strict=True)]
        need = [len(self.shapes), *(max(column, default=1) for column in zip(*self.shapes, strict=True))]
        grown = tuple(max(1 << (n - 1).bit_length(), have) for n, have in zip(need, self.capacity, strict=True))
        if grown != self.capacity:  # powers of two: few regrowths, each dropping the graphs
            self.capacity = grown
            self.widths = Plan.layout(*grown[1:], config.batch_size, 1 if config.one_sided else 2)
            self.plan = Plan(*(torch.empty(grown[0], sum(w), dtype=t, device=self.device)
                               for w, t in zip(self.widths, (torch.int64, torch.float32), strict=True)))  # fmt: skip
            self.graphs = {}
        for into, values in zip(self.plan, plan_steps(sentences, spare, *self.capacity[1:]), strict=True):
            into[: len(values)].copy_(values)
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
            with torch.cuda.graph(graph, pool=self.pool):
                self.run()
        except RuntimeError as e:  # recording refused: every step runs directly from here on, as on a CPU
            tqdm.write(f"warning: CUDA graphs unavailable ({str(e).splitlines()[0]}); steps run one kernel at a time")
            self.record = False
            return
        self.graphs[self.shape] = graph

    def run(self) -> None:
        """The step itself, in this step's shape: its row of the plan, then train_step's pooling, loss and update on
        its slots."""
        config, trainer = self.trainer.config, self.trainer
        size, rows = self.shape
        ints, floats = self.widths
        local, order, owner, starts, distinct, bounds = self.plan.ints.index_select(0, self.index)[0].split(ints)
        valid, lengths = self.plan.floats.index_select(0, self.index)[0].split(floats)
        distinct = Distinct(distinct[:rows], local[:size], order[:size], starts[: rows + 1])
        sub = trainer.optimizer.table.index_select(0, distinct.rows).requires_grad_()
        vectors = segment_mean(sub, distinct, bounds, config.dropout, owner[:size], lengths)
        loss = trainer.margin(vectors, valid.view(-1, config.batch_size))
        loss.backward()
        self.loss.copy_(trainer.apply_on_device(loss, distinct.rows, sub))
