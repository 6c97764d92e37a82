"""A training step that never waits on the GPU: fixed-size rows (unique_rows), a pooling whose backward needs
no count read back (segment_mean), one layout of a mini-batch for the device, its graph and the host
(minibatch_sentences), and the step recorded once as a CUDA graph and replayed (GraphedSteps)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm


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

    def __init__(self, trainer):  # train.Trainer, whose optimizer, margin and apply_on_device a step uses
        self.trainer, self.device = trainer, trainer.device
        self.record = trainer.device.type == "cuda"
        self.graphs: dict[int, torch.cuda.CUDAGraph | None] = {}
        self.loaded = None  # the train.MegaBatch in the buffers
        self.size = self.capacity = 0
        self.numbers = torch.zeros(3, dtype=torch.int64, device=self.device)  # start, n, where the padding sits
        self.loss = torch.zeros((), device=self.device)

    def step(self, mb, lo: int, hi: int) -> torch.Tensor | None:
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

    def load(self, mb) -> None:
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
