"""The GPU's training step, run on this CPU: pairs/s, and the slots an update works on.

    python benchmarks/bench_step.py [--steps 60] [--megabatch 10] [--batch 128] [--mode bitext] [--dim 1024]

train.py's step that never waits on the device (fixed shapes, what a CUDA graph records; train.SYNC_FREE_ON_CPU),
run on the CPU at dim 1024, 50,000 pieces, batch 128, bitext pool, on a synthetic shard (bench_gpu.py's). A CPU's
pairs/s is no GPU's: it counts the work a step does (rows gathered, pooled and updated), which the GPU's step time
follows too. Run it on two commits to compare them. Where the step sizes its slots per mini-batch, it also prints how
full they are, and it prints the ops a step dispatches, views aside: on a GPU each is a kernel, a node of the step's
CUDA graph, and the step shapes the run met (on a GPU each is a graph recorded on the host's clock; they follow the
ids, not --dim).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from bench_train import BATCH, DIM, word_sentencepiece, write_synthetic_shard
from common import machine_header
from torch.utils._python_dispatch import TorchDispatchMode

from paraphrastic import cuda_step, train


class OpCount(TorchDispatchMode):
    """The aten ops dispatched while it is entered, views aside (they launch nothing)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not (func.is_view or func is torch.ops.aten._unsafe_view.default)
        return func(*args, **(kwargs or {}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="updates (the first mega-batch's are left out)")
    p.add_argument("--megabatch", type=int, default=10, help="M, mini-batches a mega-batch")
    p.add_argument("--batch", type=int, default=BATCH, help="pairs a mini-batch")
    p.add_argument("--mode", choices=["bitext", "paraphrase"], default="bitext", help="the negatives' pool")
    p.add_argument("--dim", type=int, default=DIM, help="embedding dimension")
    args = p.parse_args()
    print(machine_header())
    train.SYNC_FREE_ON_CPU = True
    filled, before = [], []  # (real ids, id slots, distinct rows, row slots) of each full mini-batch; slots before
    # the per-step counts: cuda_step.count_steps, or GraphedSteps.counts in commits before it (compared on PYTHONPATH)
    where = cuda_step if hasattr(cuda_step, "count_steps") else cuda_step.GraphedSteps
    name = "count_steps" if where is cuda_step else "counts"
    counts = getattr(where, name, None)
    if counts is not None:

        def counted(*args):
            found = counts(*args)
            filled.extend((i, cuda_step.slots(i), r, cuda_step.slots(r + 1)) for i, r in zip(*found, strict=True))
            power = 1 << (max(found[0]) - 1).bit_length()  # the rule before: one power of two a mega-batch, for both
            before.extend([power] * len(found[0]))
            return found

        setattr(where, name, counted)
    step_ops, run = [], cuda_step.GraphedSteps.run

    def counted_run(self):
        with OpCount() as count:
            run(self)
        step_ops.append(count.ops)

    cuda_step.GraphedSteps.run = counted_run
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sp = word_sentencepiece(tmp)
        (tmp / "sp.model").write_bytes(sp)
        write_synthetic_shard(tmp / "pairs.h5", args.batch * (3 * args.megabatch + args.steps), sp)
        out = tmp / "run"
        train.main(["--train-shards", str(tmp / "pairs.h5"), "--sp-model", str(tmp / "sp.model"), "--output-dir",
                    str(out), "--dim", str(args.dim), "--batch-size", str(args.batch), "--megabatch-size",
                    str(args.megabatch), "--megabatch-anneal", "0", "--max-steps", str(args.steps), "--log-every",
                    str(args.megabatch), "--mode", args.mode, "--device", "cpu", "--quiet", "--threads",
                    str(torch.get_num_threads())])  # fmt: skip
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if r["event"] == "train"]
    rates = [r["pairs_per_s"] for r in windows[1:]]
    shapes, later = windows[-1]["shapes"], windows[-1]["shapes"] - windows[0]["shapes"]
    print(f"the GPU's step on this CPU, dim {args.dim}, batch {args.batch}, M = {args.megabatch}, {args.mode}: "
          f"{sum(rates) / len(rates):,.0f} pairs/s (mean of {len(rates)} log windows after the first); "
          f"{step_ops[-1]} ops a step (kernels on a GPU); {shapes} step shapes in {args.steps} updates, {later} of "
          "them after the first mega-batch")  # fmt: skip
    if filled:
        ids, id_slots, rows, row_slots = (sum(column) for column in zip(*filled, strict=True))
        print(f"slots of {len(filled)} mini-batches: {ids / len(filled):,.0f} ids in {id_slots / len(filled):,.0f} "
              f"({ids / id_slots:.1%} real), {rows / len(filled):,.0f} distinct rows in {row_slots / len(filled):,.0f} "
              f"({rows / row_slots:.1%} real); one power of two a mega-batch, the rule before, gave both "
              f"{sum(before) / len(before):,.0f} slots")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
