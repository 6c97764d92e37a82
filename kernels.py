"""The GPU step's two Triton kernels. `bag_sums`: each bag's sum of the table rows its ids name, in a fixed order
(the same bits every run); torch's embedding_bag walks a bag one id at a time, a thread per value, each load waiting
on the last, and was half of a step's device time at batch 128. `adam_rows`: Adam on a step's distinct rows, read
from and written back to the table and its moments in place, where a gather, torch's fused Adam and three copies
back took five kernels and moved the rows four times. Imported only where a GPU trains; without Triton (or the C
compiler it builds with) `kernel_for` says None and the step keeps torch's ops."""

from __future__ import annotations

import math
import os

import torch
from tqdm import tqdm

try:
    import triton
    import triton.language as tl
except ImportError:  # torch's CPU builds come without it
    triton = None

# The blocks: the fastest of bench_gpu.py's kernels part on an H200 (a real step at batch 128, dim 1024)
FORWARD = (4, 1024, 4)  # bag sums over a mini-batch's bags: ids a program loads at once, values of a row, warps
BACKWARD = (32, 1024, 4)  # over its distinct rows
ADAM = (1024, 2)  # Adam: values of a row a program updates, warps

if triton is not None:

    @triton.jit
    def _bag_sums(table, index, offsets, out, dim: tl.constexpr, ids: tl.constexpr, values: tl.constexpr):
        bag = tl.program_id(0)
        cols = tl.program_id(1) * values + tl.arange(0, values)
        inside = cols < dim
        start, end = tl.load(offsets + bag), tl.load(offsets + bag + 1)
        total = tl.zeros([values], dtype=tl.float32)
        for first in range(start, end, ids):
            at = first + tl.arange(0, ids)
            rows = tl.load(index + at, mask=at < end, other=0).to(tl.int64)
            block = tl.load(table + rows[:, None] * dim + cols[None, :], mask=(at < end)[:, None] & inside[None, :])
            total += tl.sum(block.to(tl.float32), 0)
        tl.store(out + bag.to(tl.int64) * dim + cols, total.to(out.dtype.element_ty), mask=inside)

    @triton.jit
    def _adam_rows(table, m, v, rows, grad, skip, steps, spare, lr, b1, b2, eps, log2_b1, log2_b2,
                   dim: tl.constexpr, values: tl.constexpr):  # fmt: skip
        at = tl.program_id(0)
        cols = tl.program_id(1) * values + tl.arange(0, values)
        row = tl.load(rows + at)
        write = (row != spare) & (tl.load(skip).to(tl.int32) == 0)  # the filler row and a skipped step: unchanged
        keep = cols < tl.where(write, dim, 0)
        step = tl.load(steps) + 1.0
        place = row.to(tl.int64) * dim + cols
        g = tl.load(grad + at.to(tl.int64) * dim + cols, mask=keep, other=0.0)
        m1 = b1 * tl.load(m + place, mask=keep, other=0.0) + (1 - b1) * g
        v1 = b2 * tl.load(v + place, mask=keep, other=0.0) + (1 - b2) * g * g
        corrected = tl.sqrt(v1) / tl.sqrt(1 - tl.exp2(step * log2_b2)) + eps
        moved = tl.load(table + place, mask=keep, other=0.0) - lr / (1 - tl.exp2(step * log2_b1)) * m1 / corrected
        tl.store(m + place, m1, mask=keep)
        tl.store(v + place, v1, mask=keep)
        tl.store(table + place, moved, mask=keep)

    def bag_sums(
        table: torch.Tensor, index: torch.Tensor, offsets: torch.Tensor, backward: bool = False
    ) -> torch.Tensor:
        """(len(offsets) - 1, dim): bag b sums the rows of `table` (contiguous) that index[offsets[b]:offsets[b +
        1]] names, in FORWARD's blocks or (`backward`: a gradient's many short bags) BACKWARD's."""
        ids, values, warps = BACKWARD if backward else FORWARD
        out = torch.empty(len(offsets) - 1, table.shape[1], dtype=table.dtype, device=table.device)
        if len(out):
            grid = (len(out), triton.cdiv(table.shape[1], values))
            _bag_sums[grid](table, index, offsets, out, table.shape[1], ids, values, num_warps=warps)
        return out

    def adam_rows(
        table: torch.Tensor,
        moments: torch.Tensor,
        rows: torch.Tensor,
        grad: torch.Tensor,
        skip: torch.Tensor,
        steps: torch.Tensor,
        spare: int,
        lr: float,
        betas: tuple[float, float],
        eps: float,
    ) -> None:
        """Adam (torch's, without weight decay) on `table`'s `rows` with their gradient `grad`, step count `steps`
        + 1 and the (2, rows, dim) `moments`, in place; rows equal to `spare` (filler) and a step whose `skip` is
        true change nothing. `steps` is left for the caller to count on."""
        values, warps = ADAM
        b1, b2 = betas
        grid = (len(rows), triton.cdiv(table.shape[1], values))
        _adam_rows[grid](table, moments[0], moments[1], rows, grad, skip, steps, spare, lr, b1, b2, eps,
                         math.log2(b1), math.log2(b2), table.shape[1], values, num_warps=warps)  # fmt: skip

else:
    bag_sums = adam_rows = None

enabled = bag_sums is not None and os.environ.get("PARAPHRASTIC_KERNELS", "1") != "0"  # 0: torch's ops
_tried: set[torch.device] = set()


def usable(values: torch.Tensor) -> bool:
    """Whether the kernels run on `values`' GPU (tried once there: Triton compiles with the machine's C compiler,
    which may be missing)."""
    global enabled
    if not values.is_cuda:
        return False
    if enabled and values.device not in _tried:
        _tried.add(values.device)
        try:
            one = torch.ones(2, 4, device=values.device)
            ids = torch.tensor([0, 1], device=values.device)
            enabled = bool(bag_sums(one, ids, torch.tensor([0, 2], device=values.device)).eq(2).all())
        except Exception as e:  # noqa: BLE001 - any failure to build or run: torch's ops serve
            enabled = False
            tqdm.write(f"warning: the Triton kernels are unavailable ({str(e).splitlines()[0][:200]}); "
                       "training with torch's ops")  # fmt: skip
    return enabled
