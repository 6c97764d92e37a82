"""Distillation: sentences with a teacher's target vectors, served in seeded batches (train.py --distill,
--relate), and the losses that pull the student's vectors toward them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from paraphrastic.fileio import InputError, iter_line_chunks
from paraphrastic.models import Bags, Model
from paraphrastic.pairs import take_bags


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
