"""The GPU step's Triton kernels (kernels.py) against torch's ops: run by Triton's interpreter on the CPU where
Triton is installed (torch's CUDA builds bring it; bench_gpu.py measures them on a GPU), skipped where it is not."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from paraphrastic import kernels

CHECK = r"""
import torch
import torch.nn.functional as F
from paraphrastic import kernels, optim

g = torch.Generator().manual_seed(0)
table = torch.randn(300, 64, generator=g)
lengths = torch.randint(0, 40, (60,), generator=g)
lengths[3] = 0  # an empty bag
offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
index = torch.randint(0, 300, (int(offsets[-1]),), generator=g)
padded = torch.cat([index, torch.full((7,), 10**9)])  # ids past the last offset: never read
want = F.embedding_bag(index, table, offsets[:-1], mode="sum")
for backward in (False, True):
    got = kernels.bag_sums(table, padded, offsets, backward=backward)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert torch.equal(got, kernels.bag_sums(table, padded, offsets, backward=backward))  # the same bits again
    assert torch.equal(got[3], torch.zeros(64))

start = torch.randn(41, 64, generator=g)  # 40 rows and the spare (filler) row
lazy, ours = optim.LazyAdam(start.clone(), 1e-2, spare=1), optim.LazyAdam(start.clone(), 1e-2, spare=1)
ours.counted = torch.tensor(0.0)
for step in range(6):
    rows = torch.cat([torch.randperm(40, generator=g)[:12], torch.tensor([40, 40])])  # the filler twice
    grad = torch.randn(14, 64, generator=g)
    grad[-2:] = 0
    skip = torch.tensor(step == 2)  # a non-finite step: nothing changes
    lazy.step(rows, grad.clone(), skip)
    kernels.adam_rows(ours.table, ours.moments, rows, grad.clone(), skip, ours.counted, 40, 1e-2, ours.betas, ours.eps)
    ours.counted += ~skip
assert float(ours.counted) == float(lazy.counted) == 5
assert torch.allclose(ours.table, lazy.table, atol=1e-6) and torch.allclose(ours.moments, lazy.moments, atol=1e-6)
assert torch.equal(ours.table[40], start[40])
print("kernels match")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (torch's CPU build)")
def test_kernels_match_torchs_ops_in_tritons_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kernels match" in done.stdout


def test_kernels_serve_gpus_only():
    """Off a GPU the step keeps torch's ops; without Triton the kernels are absent, not broken."""
    assert not kernels.usable(torch.zeros(2))
    if importlib.util.find_spec("triton") is None:
        assert kernels.bag_sums is None and kernels.adam_rows is None and not kernels.enabled
