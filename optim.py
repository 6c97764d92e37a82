"""The optimizer of the sentence table: Adam on the rows a batch touches (row-sparse, like tf LazyAdam), and
the gradient clipping and finiteness check of a step."""

from __future__ import annotations

import math

import torch
from torch.optim.adam import adam


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


class LazyAdam:
    """Adam that reads and writes only the rows in the batch (row-sparse, like tf LazyAdam).

    Its cost scales with the batch, not the vocabulary; rows absent from a step keep their moments.
    With every row in every batch it is torch.optim.Adam. The moments are two (rows, dim) tables and
    a step gathers its rows into buffers kept between steps: on machines where fresh pages are dear
    (virtual machines), allocating tens of MiB per step costs more than the arithmetic.
    """

    def __init__(self, table: torch.Tensor, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, spare: int = 0):
        """`spare`: rows at the end of `table` that are no part of the model (distinct_rows' filler), never saved."""
        self.table, self.lr, self.betas, self.eps = table, lr, betas, eps
        self.rows = table.shape[0] - spare
        self.moments = torch.zeros(2, *table.shape, dtype=table.dtype, device=table.device)
        self.buffers = torch.empty(0, dtype=table.dtype, device=table.device)
        self.steps = 0
        self.counted: torch.Tensor | None = None  # the step count on the device, for masked steps

    @torch.no_grad()
    def step(
        self,
        rows: torch.Tensor,
        grad: torch.Tensor,
        skip: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
    ) -> None:
        """Apply one Adam update to `rows` (unique) given their gradient; with `skip` (a boolean on the device) the
        update, moments and step count stay as they are where it is true, decided on the device without a wait, and
        `weights` may be the rows already gathered (a gather saved), which it updates in place."""
        if skip is not None:
            return self._masked_step(rows, grad, skip, weights)
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

    def _masked_step(
        self, rows: torch.Tensor, grad: torch.Tensor, skip: torch.Tensor, weights: torch.Tensor | None
    ) -> None:
        """`step` as torch's fused Adam (one kernel) on the gathered rows, with the step count on the device: where
        `skip` is true nothing changes, decided there. The rows go back by plain copies: the spare row, repeated as
        filler with a zero gradient, gets the same bytes from each copy (index_add_'s atomics would queue on it)."""
        if self.counted is None:
            self.counted = torch.tensor(float(self.steps), device=self.table.device)  # exact to 2**24 updates
        if self.table.is_cuda:
            from paraphrastic import kernels

            if kernels.usable(self.table):  # one kernel, in place: the filler row and a skipped step unchanged
                spare = self.rows if self.rows < len(self.table) else -1
                kernels.adam_rows(self.table, self.moments, rows, grad.contiguous(), skip, self.counted, spare,
                                  self.lr, self.betas, self.eps)  # fmt: skip
                self.counted += ~skip
                return
        weights = self.table.index_select(0, rows) if weights is None else weights
        m, v = self.moments.index_select(1, rows)
        b1, b2 = self.betas
        adam([weights], [grad], [m], [v], [], [self.counted], fused=True, found_inf=skip.float(),
             amsgrad=False, beta1=b1, beta2=b2, lr=self.lr, weight_decay=0.0, eps=self.eps, maximize=False)  # fmt: skip
        self.table.index_copy_(0, rows, weights)
        self.moments[0].index_copy_(0, rows, m)
        self.moments[1].index_copy_(0, rows, v)

    def state_dict(self) -> dict:
        steps = self.steps if self.counted is None else int(self.counted)
        return {"steps": steps, "moments": self.moments[:, : self.rows]}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.counted = int(state["steps"]), None
        self.moments[:, : self.rows].copy_(state["moments"])
