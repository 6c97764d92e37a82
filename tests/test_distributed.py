"""Distributed training under torchrun (gloo, 2 CPU ranks, in torchrun's environment): every rank ends with the
same table, a --global-megabatch run equals a single process with the run's batch, and a run resumes at another
world size.

Equality with a single process is checked to TOL: the ranks' partial gradients are summed after their own backward
passes instead of inside one, so float sums round differently (measured: at most 1.2e-7 on the table and 2.4e-7 on
the loss after 30 updates). A wrong split of the pairs, a different mining pool or a wrong loss weight moves the
table by more than 1e-3 (local mining already differs by about 1e-2). Mining runs in fp32 so that the negatives
do not hinge on bf16 rounding of vectors that differ in the last bits.
"""

import json
import multiprocessing
import os
import runpy
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, generated_sentences

from paraphrastic import distributed, models, run_setup, train

TOL = 1e-5

# One worker runs the module, so that global_runs (three training runs) is made once
pytestmark = pytest.mark.xdist_group("ddp")


@pytest.fixture(scope="module")
def data(tmp_path_factory, sp_bytes):
    """sp.model and two pair files: 97 pairs (an epoch's last mini-batch of 8 has 1 pair: rank 1 gets none of it)
    and 99 pairs (3 pairs: slices of 1 and 2)."""
    folder = tmp_path_factory.mktemp("ddp-data")
    (folder / "sp.model").write_bytes(sp_bytes)
    for n in (97, 99):
        pairs = zip(generated_sentences(n, seed=3), generated_sentences(n, seed=4), strict=True)
        (folder / f"pairs{n}.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    return folder


def run_args(data, pairs: int, out, batch: int, *extra: str) -> list[str]:
    return [
        "--train-file", str(data / f"pairs{pairs}.tsv"), "--sp-model", str(data / "sp.model"), "--output-dir", str(out),
        "--dim", "16", "--batch-size", str(batch), "--megabatch-size", "3", "--megabatch-anneal", "2",
        "--mine-precision", "fp32", "--threads", "1", "--log-every", "1", *extra,
    ]  # fmt: skip


# train.main that saves this rank's weights (table and LSTMs) after every update into the folder argv[1]
DUMPER = """
import sys, torch, torch.distributed as dist
from pathlib import Path
from paraphrastic import train
folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
def dump(trainer):
    weights = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    torch.save(weights, folder / f"rank{dist.get_rank()}.pt")
sys.exit(train.main(sys.argv[2:], on_step=dump))
"""


def torchrun(args: list[str], dump=None, launcher: bool = False, script: Path | None = None) -> None:
    """train.py (or `script`) on 2 CPU ranks (gloo); `dump`: the folder where each rank saves its final weights.
    The ranks get torchrun's environment; `launcher`: torchrun itself starts them in new interpreters, else they are
    forked from this process and run the same script (sparing torchrun's process and each rank's torch import, 4 s
    of CPU each: the suite's time is its CPU's). A forked rank's output is this test's captured output."""
    script = [str(script or ROOT / "train.py")]
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / "dumper.py").write_text(DUMPER)
        script = [str(dump / "dumper.py"), str(dump)]
    if launcher:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *script]
        done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return
    with socket.socket() as s:  # a free port for rank 0's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=run_rank, args=(script, args, env | {"RANK": str(r), "LOCAL_RANK": str(r)}))
             for r in (0, 1)]  # fmt: skip
    for rank in ranks:
        rank.start()
    try:
        for rank in ranks:
            rank.join(timeout=120)
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.exitcode for rank in ranks] == [0, 0], "a rank failed: its error is in the captured stderr"


def run_rank(script: list[str], args: list[str], env: dict) -> None:
    """A forked rank: torchrun's environment, then the script as its own interpreter would run it."""
    os.environ.update(env)
    sys.argv = [*script, *args]
    runpy.run_path(script[0], run_name="__main__")


def single(args: list[str]) -> None:
    assert train.main(args) == 0


def table(out) -> torch.Tensor:
    return models.load_model(out / "model.pt").embedding.weight.detach()


def losses(out) -> list[float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["event"] == "train"]


def assert_ranks_agree(dump, out) -> None:
    ranks = [torch.load(dump / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0]), "the ranks ended with different weights"
    assert torch.equal(ranks[0]["embedding.weight"], table(out)), "rank 0's checkpoint is not its table"


def assert_close(got, expected) -> None:
    assert (table(got) - table(expected)).abs().max().item() < TOL
    assert losses(got) == pytest.approx(losses(expected), abs=TOL)


# ----------------------------------------------------------------------------- pure parts


def test_rank_slices_split_each_minibatch_in_rank_order():
    for count, batch, world in [(97, 8, 2), (99, 8, 2), (23, 6, 3), (2, 8, 4), (5, 2, 2)]:
        per_rank = [distributed.rank_slices(count, batch, world, r) for r in range(world)]
        owned = sorted(p for slices in per_rank for lo, hi, own in slices if own for p in range(lo, hi))
        assert owned == list(range(count)), "every pair is trained by exactly one rank"
        for k, start in enumerate(range(0, count, batch)):
            size = min(batch, count - start)
            mine = [slices[k] for slices in per_rank]
            bounds = [(lo, hi) for lo, hi, own in mine if own]
            assert [lo for lo, _ in bounds] == sorted(lo for lo, _ in bounds)  # contiguous, in rank order
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
            for lo, hi, own in mine:
                assert start <= lo < hi <= start + size and (own or hi - lo == 1)


def test_merge_rows_sums_into_the_union_of_rows():
    gen = torch.Generator().manual_seed(0)
    rows = [torch.tensor([1, 4, 7]), torch.tensor([0, 4]), torch.tensor([7, 9, 2, 1])]
    grads = [torch.randn(len(r), 3, generator=gen) for r in rows]
    union, total = distributed.merge_rows(rows, grads)
    dense = torch.zeros(10, 3)
    for r, g in zip(rows, grads, strict=True):
        dense.index_add_(0, r, g)
    assert union.tolist() == [0, 1, 2, 4, 7, 9]
    torch.testing.assert_close(total, dense[union])


def test_distillation_batch_is_split_between_ranks():
    class Stream:
        def batch(self, step, device):
            lengths = torch.tensor([2, 1, 3, 2])
            return models.Bags(torch.arange(8), torch.cumsum(lengths, 0) - lengths), torch.arange(4.0)

    parts = []
    for rank in (0, 1):
        parts.append(distributed.RankDistill(Stream(), distributed.Ranks(rank, 2)).batch(0, torch.device("cpu")))
    assert [bags.ids.tolist() for bags, _ in parts] == [[0, 1, 2], [3, 4, 5, 6, 7]]
    assert [bags.offsets.tolist() for bags, _ in parts] == [[0, 2], [0, 3]]
    assert [targets.tolist() for _, targets in parts] == [[0.0, 1.0], [2.0, 3.0]]


def test_nccl_on_cpu_is_a_one_line_error(data, tmp_path, monkeypatch, capsys):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    assert train.main(run_args(data, 97, tmp_path / "out", 4, "--dist-backend", "nccl")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --dist-backend nccl needs --device cuda") and "\n" not in err


# ----------------------------------------------------------------------------- torchrun, 2 ranks


COLLECTIVES = """
import sys, torch, torch.distributed as dist
from paraphrastic import distributed
dist.init_process_group("gloo")
ranks = distributed.Ranks(r := dist.get_rank(), dist.get_world_size())
dense = [torch.full((2, 3), float(r)), torch.arange(4.0) * (r + 1)]
ranks.mean_(dense)
assert torch.equal(dense[0], torch.full((2, 3), 0.5)) and torch.equal(dense[1], torch.arange(4.0) * 1.5), dense
parts = ranks.gather_uneven(torch.arange(r + 2), torch.full((r + 2, 3), float(r)))
assert [p[0].tolist() for p in parts] == [[0, 1], [0, 1, 2]] and [p[1].shape[0] for p in parts] == [2, 3]
rows, grad, loss = ranks.sum_rows(torch.tensor([[1, 5], [5, 9]][r]), torch.ones(2, 3) * (r + 1), torch.tensor(2.0 * r))
assert rows.tolist() == [1, 5, 9] and grad[:, 0].tolist() == [0.5, 1.5, 1.0] and loss.item() == 1.0, (rows, grad, loss)
assert ranks.any(r == 1) and not ranks.any(False)
dist.destroy_process_group()
"""


def test_collectives_on_two_ranks(tmp_path):
    """The collectives the trainer asks its Ranks for, on 2 gloo ranks: mean of dense tensors, uneven all-gather, the row-sparse
    sum over the union of rows with the mean loss, and the stop consensus."""
    (tmp_path / "worker.py").write_text(COLLECTIVES)
    torchrun([], script=tmp_path / "worker.py")


@pytest.fixture(scope="module")
def global_runs(data, tmp_path_factory):
    """2 ranks x batch 4 with --global-megabatch for 11 updates (stopping inside a mega-batch), and single-process
    runs with batch 8 for 11 and for 30 updates (two epochs: the last mini-batches of 1 pair included)."""
    folder = tmp_path_factory.mktemp("ddp-global")
    torchrun(run_args(data, 97, folder / "ddp", 4, "--global-megabatch", "--max-steps", "11"), dump=folder / "dump",
             launcher=True)  # fmt: skip
    single(run_args(data, 97, folder / "single11", 8, "--max-steps", "11"))
    single(run_args(data, 97, folder / "single30", 8, "--max-steps", "30"))
    return folder


def test_global_megabatch_on_two_ranks_equals_one_process_with_the_run_batch(global_runs, data):
    assert_ranks_agree(global_runs / "dump", global_runs / "ddp")
    assert_close(global_runs / "ddp", global_runs / "single11")
    state = torch.load(global_runs / "ddp" / "resume.pt", weights_only=True)
    assert state["position"]["inner"] > 0 and state["args"]["batch_size"] == 8  # mid mega-batch, the run's batch
    tokenizer = models.Tokenizer((data / "sp.model").read_bytes(), lowercase=True)
    args = train.parse_args(run_args(data, 97, "x", 8))
    start = run_setup.new_model(args, args.output_dir, 1, True, sp=tokenizer).embedding.weight.detach()
    assert (table(global_runs / "ddp") - start).abs().max().item() > 100 * TOL  # the tolerance is far below a step


def test_resume_with_another_world_size(global_runs, data):
    """2 -> 1 and 1 -> 2 ranks, each resuming inside a mega-batch: both end where the single process does."""
    shutil.copytree(global_runs / "ddp", global_runs / "two-to-one")
    single(run_args(data, 97, global_runs / "two-to-one", 8, "--max-steps", "30", "--resume"))
    assert_close(global_runs / "two-to-one", global_runs / "single30")

    shutil.copytree(global_runs / "single11", global_runs / "one-to-two")
    resumed = run_args(data, 97, global_runs / "one-to-two", 4, "--global-megabatch", "--max-steps", "30", "--resume")
    torchrun(resumed, dump=global_runs / "dump-one-to-two")
    assert_ranks_agree(global_runs / "dump-one-to-two", global_runs / "one-to-two")
    assert_close(global_runs / "one-to-two", global_runs / "single30")


def test_rank_local_mining_and_resume_finishing_the_saved_megabatch(data, tmp_path):
    """Without --global-megabatch each rank mines its own slices, so the run differs from a single process; a run
    saved inside a mega-batch and resumed on 1 process finishes that mega-batch with the negatives the 2 ranks
    mined (the mega-batch of updates 11-13 ends with 3 pairs, split 1 + 2)."""
    torchrun(run_args(data, 99, tmp_path / "ddp", 4, "--max-steps", "13"), dump=tmp_path / "dump")
    assert_ranks_agree(tmp_path / "dump", tmp_path / "ddp")
    single(run_args(data, 99, tmp_path / "single", 8, "--max-steps", "13"))
    assert (table(tmp_path / "ddp") - table(tmp_path / "single")).abs().max().item() > 100 * TOL

    torchrun(run_args(data, 99, tmp_path / "resumed", 4, "--max-steps", "11"))
    state = torch.load(tmp_path / "resumed" / "resume.pt", weights_only=True)
    assert state["position"] == {"step": 11, "epoch": 0, "offset": 80, "inner": 1}
    single(run_args(data, 99, tmp_path / "resumed", 8, "--max-steps", "13", "--resume"))
    assert_close(tmp_path / "resumed", tmp_path / "ddp")


def test_lstm_ranks_agree_on_table_and_lstm_weights(data, tmp_path):
    """The LSTM's dense gradients are averaged over the ranks too: both ranks end with the same LSTM."""
    args = run_args(data, 99, tmp_path / "ddp", 4, "--model", "blstm", "--max-steps", "6")
    torchrun(args, dump=tmp_path / "dump")
    assert_ranks_agree(tmp_path / "dump", tmp_path / "ddp")
    ranks = torch.load(tmp_path / "dump" / "rank0.pt", weights_only=True)
    assert any(k.startswith("lstms.0.") for k in ranks)
    saved = torch.load(tmp_path / "ddp" / "model.pt", weights_only=True)["lstm"]
    assert all(torch.equal(saved[k], ranks[f"lstms.{k}"]) for k in saved)


@pytest.mark.parametrize("grouped", [False, True])
def test_packed_pairs_come_back_whole_with_their_groups(grouped):
    """What --global-megabatch all-gathers: a rank's pairs packed in one tensor, unpacked the same, groups too."""
    import numpy as np

    from paraphrastic.pairs import PairData

    rng = np.random.default_rng(0)
    lens = [rng.integers(1, 6, 9) for _ in range(2)]
    sides = [(rng.integers(0, 50, int(n.sum())), n) for n in lens]
    data = PairData(*sides, rng.integers(-1, 4, 9) if grouped else None)
    back = distributed.unpack_pairs(distributed.pack_pairs(data))
    for side in ("src", "tgt"):
        assert all(np.array_equal(a, b) for a, b in zip(getattr(back, side), getattr(data, side), strict=True))
    assert (back.groups is None) if not grouped else np.array_equal(back.groups, data.groups)
