"""The hardest negative of each sentence of a mega-batch (Wieting et al.'s mega-batching): exact, from the cosine
matrix in blocks of matrix products, never a sentence's partner, a copy of it, a known paraphrase of it, or a
sentence of its own paraphrase group where the pairs name groups.

sentence_groups numbers the distinct sentences, forbidden_pairs lists the pairs that may never be negatives, and
mine_hardest takes each row's and column's best allowed candidate block by block, asking the device for nothing in
between (pairs_by_block, column_max), so that a GPU runs the blocks without waiting on the host.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from paraphrastic.encoders import bag_owners
from paraphrastic.models import native_bf16

MINE_CHUNK = 2048  # rows per similarity block when mining (measured best of 2048-6400)
MINE_CHUNK_CUDA = 8192  # on a GPU: a block of bf16 similarities is 128 MiB, and a mega-batch of 100 x 512 pairs
# takes 91 blocks for paraphrases where 2048 took 1,275, each with its launches
MAX_LISTED_COPIES = 64  # copies of one sentence in a mega-batch past which forbidden pairs are not listed


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


def label_groups(labels: torch.Tensor) -> torch.Tensor:
    """Group numbers from paraphrase labels: one group per label, each unlabelled sentence (negative) its own."""
    alone = -1 - torch.arange(len(labels), device=labels.device)
    return torch.unique(torch.where(labels >= 0, labels, alone), return_inverse=True)[1]


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
    chunk: int | None = None,
    labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Index of the hardest allowed negative of each of the 2n sentences (-1 where none is allowed); with `labels`
    (each sentence's paraphrase group, negative for none) no sentence of a group is another's negative either.

    With bitext a source's candidates are the targets and vice versa; otherwise every sentence. The
    cosine matrix is computed in blocks of `chunk` rows (default MINE_CHUNK, MINE_CHUNK_CUDA on a GPU) as
    matrix products in `dtype`; each block serves both its rows and (by symmetry) its columns, so no pair
    of blocks is computed twice. Ties go to the first index. The blocks ask the device nothing back (their
    forbidden pairs are found by one read for all of them), so a GPU runs them without waiting on the host.
    """
    n2 = len(vectors)
    n = n2 // 2
    chunk = chunk or (MINE_CHUNK_CUDA if vectors.is_cuda else MINE_CHUNK)
    unit = F.normalize(vectors.float(), dim=1).to(dtype)
    if bitext:  # sources x targets: every block
        starts = range(0, n, chunk)
        blocks = [(a, min(a + chunk, n), n + b, min(n + b + chunk, n2)) for a in starts for b in starts]
    else:  # all x all: the upper triangle of blocks
        starts = range(0, n2, chunk)
        blocks = [(a, min(a + chunk, n2), b, min(b + chunk, n2)) for i, a in enumerate(starts) for b in starts[i:]]
    kinds = [groups] if labels is None else [groups, label_groups(labels)]  # copies, and paraphrases named as such
    copies = max(int(torch.bincount(kind).max()) for kind in kinds) if n2 else 0
    if copies > MAX_LISTED_COPIES:  # listing the pairs would take copies^2 memory: compare groups per block
        partners = [kind[(torch.arange(n2, device=groups.device) + n) % n2] for kind in kinds]
    else:
        rows, cols = (torch.cat(side) for side in zip(*map(forbidden_pairs, kinds), strict=True))
        bad_rows, bad_cols, spans = pairs_by_block(rows, cols, blocks, chunk, n if bitext else 0)
    best = torch.full((n2,), -math.inf, device=vectors.device)
    arg = torch.full((n2,), -1, dtype=torch.int64, device=vectors.device)

    def update(lo: int, hi: int, values: torch.Tensor, where: torch.Tensor) -> None:
        values = values.float()
        better = values > best[lo:hi]
        best[lo:hi] = torch.where(better, values, best[lo:hi])
        arg[lo:hi] = torch.where(better, where, arg[lo:hi])

    for k, (r0, r1, c0, c1) in enumerate(blocks):
        sim = unit[r0:r1] @ unit[c0:c1].T
        if copies > MAX_LISTED_COPIES:  # forbidden_pairs' relation, by group numbers
            for kind, partner in zip(kinds, partners, strict=True):
                rows, cols = kind[r0:r1, None], kind[None, c0:c1]
                sim.masked_fill_((rows == cols) | (partner[r0:r1, None] == cols) | (rows == partner[None, c0:c1]),
                                 -math.inf)  # fmt: skip
        else:
            lo, hi = spans[k]
            sim[bad_rows[lo:hi] - r0, bad_cols[lo:hi] - c0] = -math.inf
        values, where = sim.max(dim=1)
        update(r0, r1, values, where + c0)
        if r0 != c0:
            values, where = column_max(sim)
            update(c0, c1, values, where + r0)
    return torch.where(best > -math.inf, arg, -1)


def pairs_by_block(
    rows: torch.Tensor, cols: torch.Tensor, blocks: list[tuple[int, int, int, int]], chunk: int, col0: int
) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """The pairs (rows, cols) sorted by the block of mine_hardest's that holds them (columns counted from `col0`),
    and each block's [start, end) in them, read back once for all the blocks. Pairs in no block are in no span:
    their mirror image is in one."""
    if not blocks:
        return rows, cols, []
    side = -(-blocks[-1][3] // chunk) + 1  # more than the column blocks either way from col0

    def block(r, c):  # the number of the block that holds row r and column c (ints or tensors: // floors both)
        return (r // chunk) * (2 * side) + (c - col0) // chunk + side

    key = torch.where(rows < blocks[-1][1], block(rows, cols), -1)  # rows past the blocks' (bitext's targets): none
    key, order = torch.sort(key, stable=True)
    wanted = torch.tensor([block(r0, c0) for r0, _, c0, _ in blocks], dtype=key.dtype, device=key.device)
    spans = torch.stack([torch.searchsorted(key, wanted), torch.searchsorted(key, wanted, right=True)], 1)
    return rows[order], cols[order], spans.tolist()


def column_max(sim: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sim.max(dim=0): each column's maximum and the first row holding it, without asking the device how many
    rows hold it (a GPU then never waits on the host); on CPUs about as fast as a nonzero of the maxima, and
    several times faster than torch's indexed max along dim 0."""
    values = sim.amax(dim=0)
    small = torch.int16 if len(sim) < 2**15 else torch.int32  # the narrower, the less memory the comparison moves
    rows = torch.arange(len(sim), dtype=small, device=sim.device).unsqueeze(1)
    return values, torch.where(sim == values, rows, len(sim)).amin(dim=0).long()


def mining_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype of the mining products: --mine-precision, with auto meaning bf16 only where it is native."""
    if precision == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    return torch.bfloat16 if precision == "bf16" else torch.float32
