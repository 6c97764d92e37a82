"""Distributed data-parallel training for train.py with torch.distributed, launched by torchrun.

    torchrun --standalone --nproc_per_node 2 train.py --train-file pairs.tsv --output-dir runs/ddp [--global-megabatch]

train.py's trainer asks one `Ranks` object (made by `join`): who writes, whether any rank was interrupted, the
ranks' summed gradients, and this rank's share of the data. A single process gets `Ranks()`, rank 0 of 1, whose
every answer leaves training as it was. Under torchrun with W ranks and --batch-size b:

- The run's batch is B = W * b pairs: the trainer's positions, steps, mega-batches (M * B pairs) and resume state
  are those of a single process with --batch-size B. Mini-batch k of a mega-batch is its positions
  [kB, (k+1)B) and rank r trains on the r-th of W contiguous slices of it (slice sizes differ by at most one in an
  epoch's last, short mini-batch; a rank whose slice would be empty takes one pair of it at weight zero, so that
  every rank runs the same collectives). Ranks never train on the same pair.
- Mining: by default each rank mines over its own slices of the mega-batch's M mini-batches (M * b pairs). With
  --global-megabatch the ranks all-gather their slices (token ids and lengths) into the whole mega-batch, in epoch
  order, and each mines it as one pool: a W-rank run then equals a single-process run with --batch-size W * b
  (same pairs, same negatives, same updates) up to float summation order, with --dropout 0 (dropout masks are
  drawn per rank).
- Gradients: each rank weights its pairs so that the mean of the ranks' losses is the mini-batch's mean loss; the
  row-sparse table gradients are all-gathered and summed over the union of rows in rank order (so every rank
  applies the identical update) and divided by W; dense gradients are averaged with one all-reduce.
- Outputs: rank 0 alone writes checkpoints, metrics.jsonl and the progress bar; the others wait at a barrier.
- Resume: resume.pt holds the global position and the current mega-batch's negatives as global sentence indices,
  so a run resumes at any world size that keeps B: the partly trained mega-batch is read whole and finished
  with its saved negatives, exactly as the interrupted run would have; later mega-batches follow the new layout.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from paraphrastic.fileio import InputError
from paraphrastic.models import Bags, resolve_device
from paraphrastic.pairs import PairData

# ----------------------------------------------------------------------------- the ranks


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run, and the few collectives the trainer asks for: rank `rank` of `world`,
    collectives' tensors on `comm`. Alone (no torchrun): rank 0 of 1, and every collective returns its input."""

    rank: int = 0
    world: int = 1
    comm: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """True on rank 0 (and in a single process): the one process that writes outputs."""
        return self.rank == 0

    def settings(self, settings: dict) -> dict:
        """The settings of the whole run from one rank's: the per-rank batch sizes times W, the node's cores shared
        between its ranks. Alone: unchanged."""
        if self.world == 1:
            return settings
        settings = settings | {"world_size": self.world, "batch_size": settings["batch_size"] * self.world}
        if settings["distill_batch_size"]:
            settings["distill_batch_size"] *= self.world
        if settings["threads"] is None:
            settings["threads"] = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        return settings

    def any(self, flag: bool) -> bool:
        """Whether `flag` is set on any rank, so that all ranks take the same branch (a Ctrl-C that torchrun forwards
        reaches the ranks at different moments)."""
        if self.world == 1:
            return flag
        value = torch.tensor([float(flag)], device=self.comm)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def main_writes(self, save: Callable[[], None]) -> None:
        """Run `save` on rank 0 alone; the other ranks wait until its files are complete."""
        if self.is_main:
            save()
        if self.world > 1:
            dist.barrier()

    @contextlib.contextmanager
    def rank_zero_first(self, config):
        """Run the block on rank 0 first, then on the others, with the config to use: the other ranks read the
        sentencepiece model rank 0 trained and wrote to --output-dir instead of training their own. Alone: the
        block, with the config."""
        if self.world == 1:
            yield config
            return
        dist.barrier()  # every rank has removed stale temporaries before rank 0 writes any
        if not self.is_main:
            dist.barrier()
            trained = config.output_dir / "sp.model"
            if config.train_file and config.sp_model is None and trained.exists():
                config = dataclasses.replace(config, sp_model=trained)  # as rank 0 has it, resumed or not
        yield config
        if self.is_main:
            dist.barrier()

    def mean_(self, tensors: list[torch.Tensor]) -> None:
        """Average tensors over the ranks in place, in one all-reduce: dense parameters' gradients (every rank passes
        the same shapes in the same order) and the loss."""
        if self.world == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors]).to(self.comm)
        dist.all_reduce(flat)
        flat /= self.world
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
            t.copy_(part.view_as(t))

    def gather_uneven(self, *tensors: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """Every rank's `tensors` in rank order. They share a first dimension whose size may differ between ranks:
        the sizes are all-gathered first, then each tensor padded to the largest."""
        device = tensors[0].device
        size = torch.tensor([len(tensors[0])], device=self.comm)
        sizes = [torch.zeros_like(size) for _ in range(self.world)]
        dist.all_gather(sizes, size)
        sizes = [int(s) for s in sizes]
        gathered = []
        for t in tensors:
            padded = t.new_zeros((max(sizes), *t.shape[1:]), device=self.comm)
            padded[: len(t)] = t
            parts = [torch.empty_like(padded) for _ in range(self.world)]
            dist.all_gather(parts, padded)
            gathered.append([p[:n].to(device) for p, n in zip(parts, sizes, strict=True)])
        return list(zip(*gathered, strict=True))

    def sum_rows(
        self, rows: torch.Tensor, grad: torch.Tensor, loss: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The update's global row-sparse gradient and loss, identical on every rank: the ranks' (rows, grad) summed
        over the union of rows and divided by W, and the ranks' mean loss (each rank weighted its pairs so that both
        are the mini-batch's). Alone: the arguments."""
        if self.world == 1:
            return rows, grad, loss
        parts = self.gather_uneven(rows, grad)
        rows, grad = merge_rows([r for r, _ in parts], [g for _, g in parts])
        loss = loss.detach().clone()
        self.mean_([loss])
        return rows, grad / self.world, loss

    def share(self, trainer) -> None:
        """Give a (possibly resumed) trainer this rank's share: a RankSampler for the mega-batches to come, a view of
        the resumed mega-batch (read whole, with its saved global negatives) and of the distillation (and --relate)
        batches."""
        if self.world == 1:
            return
        config = trainer.config
        trainer.sampler = RankSampler(trainer.sampler, config.batch_size, config.global_megabatch, self)
        if trainer.megabatch is not None:
            layout = Layout(config.seed, trainer.epoch, trainer.offset, trainer.megabatch.n, config.batch_size, True)
            trainer.megabatch = RankMegaBatch(trainer.megabatch, layout, self)
        if trainer.distill is not None:
            trainer.distill = RankDistill(trainer.distill, self)
        if trainer.relate is not None:
            trainer.relate = RankDistill(trainer.relate, self)

    def view(self, megabatch, data):
        """The trainer's freshly mined mega-batch: this rank's view of the pool mined from `data`. Alone: as is."""
        layout = getattr(data, "layout", None)
        return megabatch if layout is None else RankMegaBatch(megabatch, layout, self)


ALONE = Ranks()  # a single process: rank 0 of 1


def join(device: str, backend: str) -> tuple[Ranks, str]:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT): one GPU per local rank with NCCL, gloo on CPU. Returns this process's Ranks and the device it
    trains on. Without torchrun: a single process on `device`."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return ALONE, device
    resolved = resolve_device(device)
    if resolved.type == "cuda":
        resolved = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(resolved)
        device = str(resolved)
    backend = backend if backend != "auto" else "nccl" if resolved.type == "cuda" else "gloo"
    if backend == "nccl" and resolved.type != "cuda":
        raise InputError("--dist-backend nccl needs --device cuda (NCCL moves GPU tensors); use gloo on CPU")
    dist.init_process_group(backend, device_id=resolved if backend == "nccl" else None)
    atexit.register(dist.destroy_process_group)
    ranks = Ranks(dist.get_rank(), dist.get_world_size(), resolved if backend == "nccl" else torch.device("cpu"))
    if ranks.is_main:
        print(f"distributed: {ranks.world} ranks, {backend}", flush=True)
    return ranks, device


def merge_rows(rows: list[torch.Tensor], grads: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum row-sparse gradients (each with unique rows) into the sorted union of their rows, adding them in list
    order: one index_add per part, so the result does not depend on the device's scheduling of atomic adds."""
    union, inverse = torch.unique(torch.cat(rows), return_inverse=True)
    total = grads[0].new_zeros(len(union), *grads[0].shape[1:])
    for idx, grad in zip(inverse.split([len(r) for r in rows]), grads, strict=True):
        total.index_add_(0, idx, grad)
    return union, total


# ----------------------------------------------------------------------------- data


class Layout(NamedTuple):
    """Where a mega-batch comes from: `count` pairs from `start` of the epoch's order, mini-batches of `batch`;
    `gathered`: the pool holds the whole mega-batch in order, else only this rank's slices."""

    seed: int
    epoch: int
    start: int
    count: int
    batch: int
    gathered: bool


def rank_slices(count: int, batch: int, world: int, rank: int) -> list[tuple[int, int, bool]]:
    """(lo, hi, owned) for each mini-batch of a mega-batch of `count` pairs: `rank`'s contiguous slice of its
    positions, the W slices in rank order with sizes differing by at most one. A rank whose slice would be empty
    gets one pair of that mini-batch instead, not owned (trained at weight zero)."""
    slices = []
    for start in range(0, count, batch):
        size = min(batch, count - start)
        lo, hi = start + rank * size // world, start + (rank + 1) * size // world
        slices.append((lo, hi, True) if hi > lo else (lo, lo + 1, False))
    return slices


def pack_pairs(data: PairData) -> torch.Tensor:
    """PairData as one int64 tensor: pairs, source ids, whether groups follow, then lengths and ids of both sides,
    then the groups."""
    (src_ids, src_len), (tgt_ids, tgt_len) = data.src, data.tgt
    head = np.array([len(src_len), len(src_ids), data.groups is not None])
    groups = [] if data.groups is None else [data.groups]
    return torch.from_numpy(np.concatenate([head, src_len, tgt_len, src_ids, tgt_ids, *groups]).astype(np.int64))


def unpack_pairs(packed: torch.Tensor) -> PairData:
    """The PairData that pack_pairs packed."""
    flat = packed.cpu().numpy()
    n, n_src, grouped = int(flat[0]), int(flat[1]), bool(flat[2])
    src_len, tgt_len = flat[3 : 3 + n], flat[3 + n : 3 + 2 * n]
    ids = flat[3 + 2 * n : len(flat) - n * grouped]
    return PairData((ids[:n_src], src_len), (ids[n_src:], tgt_len), flat[len(flat) - n :] if grouped else None)


class RankSampler:
    """The trainer's sampler under torchrun: read() returns this rank's slices of a mega-batch or, with
    --global-megabatch, the whole mega-batch all-gathered from every rank's slices, tagged with its Layout."""

    def __init__(self, sampler, batch: int, gathered: bool, ranks: Ranks):
        self.sampler, self.batch, self.gathered = sampler, batch, gathered
        self.ranks = ranks

    def __len__(self) -> int:
        return len(self.sampler)

    def read(self, epoch: int, start: int, count: int):
        """The pool of the mega-batch of `count` pairs (fewer at the end of the epoch) at `start`."""
        count = min(count, len(self) - start)
        slices = rank_slices(count, self.batch, self.ranks.world, self.ranks.rank)
        if self.gathered:
            data = self._gather(epoch, start, count)
        else:
            data = PairData.concat([self.sampler.read(epoch, start + lo, hi - lo) for lo, hi, _ in slices])
        data.layout = Layout(self.sampler.seed, epoch, start, count, self.batch, self.gathered)
        return data

    def _gather(self, epoch: int, start: int, count: int):
        """Every rank reads the slices it owns; all-gathered and put in epoch order they are the mega-batch."""
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        world, rank = self.ranks.world, self.ranks.rank
        owned = [(lo, hi) for lo, hi, own in rank_slices(count, self.batch, world, rank) if own]
        mine = PairData.concat(
            [PairData(empty, empty)] + [self.sampler.read(epoch, start + lo, hi - lo) for lo, hi in owned]
        )
        parts = [unpack_pairs(p) for (p,) in self.ranks.gather_uneven(pack_pairs(mine))]
        positions = np.concatenate(
            [np.arange(lo, hi) for r in range(world) for lo, hi, own in rank_slices(count, self.batch, world, r) if own]
        )
        return PairData.concat(parts).take(np.argsort(positions))


def global_negatives(
    negatives: torch.Tensor, positions: np.ndarray, owned: np.ndarray, count: int, ranks: Ranks
) -> torch.Tensor:
    """The negatives mined in this rank's pool as global sentence indices of the mega-batch (sources 0..count-1,
    targets count..2count-1; -1: none), all-gathered from the ranks that own them: what resume.pt records."""
    where = torch.as_tensor(positions, device=negatives.device)
    sentence = torch.cat([where, where + count])  # pool sentence -> mega-batch sentence
    keep = torch.as_tensor(owned, device=negatives.device).repeat(2)
    mapped = torch.where(negatives >= 0, sentence[negatives.clamp_min(0)], -1)
    out = torch.full((2 * count,), -1, dtype=torch.int64, device=negatives.device)
    for anchors, negs in ranks.gather_uneven(sentence[keep], mapped[keep]):
        out[anchors] = negs
    return out


class RankMegaBatch:
    """This rank's view of a mined mega-batch of `n` pairs: the trainer asks for mini-batch [start, stop) in global
    positions and gets this rank's slice, its validity scaled so that the ranks' mean loss is the mini-batch's
    mean loss. `negatives` are global sentence indices (for resume.pt)."""

    def __init__(self, pool, layout: Layout, ranks: Ranks):
        self.pool, self.layout, self.n, self.rank = pool, layout, layout.count, ranks.rank
        slices = rank_slices(layout.count, layout.batch, ranks.world, ranks.rank)
        sizes = [min(layout.batch, layout.count - lo) for lo in range(0, layout.count, layout.batch)]
        self.weights = [
            (hi - lo) * ranks.world / size if own else 0.0 for (lo, hi, own), size in zip(slices, sizes, strict=True)
        ]
        if layout.gathered:
            self.ranges = [(lo, hi) for lo, hi, _ in slices]
            self.negatives = pool.negatives
            return
        ends = np.cumsum([hi - lo for lo, hi, _ in slices])
        self.ranges = list(zip((ends - [hi - lo for lo, hi, _ in slices]).tolist(), ends.tolist(), strict=True))
        positions = np.concatenate([np.arange(lo, hi) for lo, hi, _ in slices])
        owned = np.concatenate([np.full(hi - lo, own) for lo, hi, own in slices])
        # A pair not owned trains at weight zero on its own partner, so it touches no row its owner does not.
        pool.negatives[torch.as_tensor(~owned, device=pool.negatives.device).repeat(2)] = -1
        self.negatives = global_negatives(pool.negatives, positions, owned, layout.count, ranks)

    def minibatch(self, start: int, stop: int, one_sided: bool):
        """This rank's (bags, weighted validity) of the trainer's mini-batch [start, stop); dropout is
        seeded per rank and mini-batch, so a resumed run draws the masks the interrupted one would have."""
        k = start // self.layout.batch
        lo, hi = self.ranges[k]
        key = [self.layout.seed, self.layout.epoch, self.layout.start + start, self.rank]
        torch.manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))
        bags, valid = self.pool.minibatch(lo, hi, one_sided)
        return bags, [v * self.weights[k] for v in valid]


class RankDistill:
    """This rank's contiguous slice of each distillation batch (every rank takes all of it when W does not divide
    it), so that the ranks' mean distillation loss is the batch's."""

    def __init__(self, stream, ranks: Ranks):
        self.stream, self.world, self.rank = stream, ranks.world, ranks.rank

    def batch(self, step: int, device: torch.device) -> tuple[Bags, torch.Tensor]:
        bags, targets = self.stream.batch(step, device)
        n = len(bags.offsets)
        if n % self.world:
            return bags, targets
        lo, hi = self.rank * n // self.world, (self.rank + 1) * n // self.world
        return bags.slice(lo, hi), targets[lo:hi]
