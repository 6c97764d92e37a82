"""The one device check: speed on the GPU and on every core, and CUDA's results against the CPU's, in one call of
under ten minutes on a lent machine, self-contained.

    python benchmarks/bench_gpu.py --data DIR [--dry-run]

Prints the machine; the device's fp32 and bf16 matrix-product rates; kernels.py's Triton kernels timed in each
block size on a real step's arguments beside torch's ops (the part "kernels"); train.py's pairs/s at dim 1024, 50,000
pieces, batch 128 with M = 100 and M = 10, and batch 512 and 1024 with M = 100 (paraphrase and bitext pools,
synthetic HDF5 shards), as a fraction of the exact-mining bound at bf16's rate; paraphrastic-embed's sentences/s on
cuda (CPU workers tokenize, the GPU pools) beside the CPU's on all cores; every core (bench_cores.py with 1 and all
workers on --core-lines lines, paraphrastic-embed and model.encode, the limit N x sentencepiece beside them, and the
start-up apart); a teacher's sentences/s (a MiniLM-L6-shaped encoder with random weights and pre-tokenized input of
32 tokens: the forward pass a teacher's labelling spends its time in) in fp32 and in bf16 autocast, with the cosine
of the two; and the equality checks: embed, score and evaluate on cuda against cpu, a short training run on each,
and a CUDA run stopped and resumed against the straight one, bit for bit. DIR holds the few files it reads (see
`pack_data`): `lines.txt` (sentences to embed), `pairs.tsv` (caption pairs for the short run), and `sts/en/` (the
STS sets evaluate reads). --dry-run substitutes cpu for cuda and shrinks every part, to test the script (the test
suite runs it) where there is no GPU. --kernel-arms torch,triton,tuned runs train and profile once with torch's ops,
once with the kernels as shipped and once in the kernels part's fastest blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from bench_train import BATCH, DIM, mining_bound, word_sentencepiece, write_synthetic_shard
from common import ROOT, machine_header, write_repeated

from paraphrastic import kernels

BIN = Path(sys.executable).parent
PARTS = (
    "kernels",
    "train",
    "resume",
    "cores",
    "profile",
    "equal",
    "embed",
    "teacher",
)  # all together take over 10 minutes


def product_rate(device: str, dtype: torch.dtype, n: int) -> float:
    """FLOP/s of an n x n by n x n product."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    runs, start = 10, time.perf_counter()
    for _ in range(runs):
        a @ b
    sync(device)
    return 2 * n**3 * runs / (time.perf_counter() - start)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(*cmd: str | Path) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"failed: {' '.join(map(str, cmd))}\n{done.stderr[-3000:]}")
    return done


def train_run(*args: str | Path | int) -> None:
    """paraphrastic-train in this process (the command's own main: torch is imported here already, and each of
    the check's runs would otherwise import it again); what it prints is kept for the error if it fails."""
    from paraphrastic import train

    argv, said = [str(a) for a in args], io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = train.main([*argv, "--quiet"])
    if code != 0:
        raise RuntimeError(f"failed: paraphrastic-train {' '.join(argv)}\n{said.getvalue()[-3000:]}")


def section(title: str, work, *args) -> None:
    """Print a title and run one part of the check; a failure is printed and the other parts still run (the
    check is one call on a lent machine)."""
    print(title, flush=True)
    start = time.perf_counter()
    try:
        work(*args)
    except Exception as e:  # noqa: BLE001 - any failure: report it and go on to the next part
        print(f"  FAILED: {type(e).__name__}: {e}")
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)


def training_data(folder: Path, pairs: int) -> None:
    """The synthetic shard of `pairs` pairs and the word-level sentencepiece model that train_rates and
    step_profile train on."""
    sp = word_sentencepiece(folder)
    (folder / "sp.model").write_bytes(sp)
    write_synthetic_shard(folder / "pairs.h5", pairs, sp)


SHIPPED = {name: getattr(kernels, name) for name in ("FORWARD", "BACKWARD", "ADAM")}  # kernels.py's blocks
TUNED: dict[str, tuple] = {}  # the kernels' fastest blocks, found by tune_kernels, for the arm "tuned"


def use_kernels(arm: str) -> None:
    """Set the GPU step's ops for the next runs: "torch" (embedding_bag and fused Adam), "triton" (kernels.py's
    kernels in their blocks as shipped), "tuned" (in tune_kernels' fastest blocks) or "" (the default)."""
    if arm:
        kernels.enabled = arm != "torch" and kernels.bag_sums is not None
        for name, blocks in (SHIPPED | (TUNED if arm == "tuned" else {})).items():
            setattr(kernels, name, blocks)


def used(arm: str) -> str:
    """The ops the last run used, for its line ("" without arms): kernels.py turns itself off where it fails."""
    if not arm:
        return ""
    if not kernels.enabled:
        return ", torch's ops"
    return f", {arm} kernels {kernels.FORWARD} / {kernels.BACKWARD} / {kernels.ADAM}"


def tune_kernels(folder: Path, device: str, dim: int) -> None:
    """Time kernels.py's kernels in each block size on a real step's arguments (a short run at batch 128, M = 100,
    bitext: its last eager call each way) beside torch's ops, and keep the fastest for the arm "tuned"."""
    from paraphrastic import train
    from paraphrastic.optim import LazyAdam

    if not kernels.usable(torch.zeros(1, device=device)):
        print("  the kernels do not run here (no GPU, Triton or its compiler): nothing to tune")
        return
    seen, plain = {}, kernels.bag_sums

    def recording(table, index, offsets, backward=False):
        if not torch.cuda.is_current_stream_capturing():  # a graph's tensors change as it replays
            seen[backward] = (table.clone(), index.clone(), offsets.clone())
        return plain(table, index, offsets, backward)

    kernels.bag_sums = recording
    try:
        train.main(["--train-shards", str(folder / "pairs.h5"), "--sp-model", str(folder / "sp.model"), "--output-dir",
                    str(folder / "tune"), "--dim", str(dim), "--batch-size", str(BATCH), "--megabatch-size", "100",
                    "--megabatch-anneal", "0", "--max-steps", "200", "--mode", "bitext", "--device", device, "--quiet"])  # fmt: skip
    finally:
        kernels.bag_sums = plain
    for backward, name in ((False, "FORWARD"), (True, "BACKWARD")):
        table, index, offsets = seen[backward]
        ids = index[: int(offsets[-1])]
        torch_us = timed(device, partial(torch.nn.functional.embedding_bag, ids, table, offsets[:-1], mode="sum"))
        times = {}
        for blocks in [(i, v, w) for i in (4, 8, 16, 32) for v in (256, 512, 1024) for w in (2, 4, 8)]:
            setattr(kernels, name, blocks)
            times[blocks] = timed(device, partial(plain, table, index, offsets, backward))
        TUNED[name] = best = min(times, key=times.get)
        print(f"  bag sums {'backward' if backward else 'forward'} ({len(offsets) - 1:,} bags, {len(ids):,} ids, "
              f"{table.shape[0]:,} x {table.shape[1]} table): torch's embedding_bag {torch_us:.1f} us, shipped "
              f"{SHIPPED[name]} {times[SHIPPED[name]]:.1f} us, fastest {best} {times[best]:.1f} us")  # fmt: skip
    rows = len(seen[True][2]) - 1  # a step's distinct rows
    table, moments = torch.randn(50_001, dim, device=device), torch.zeros(2, 50_001, dim, device=device)
    picked, grad = torch.randperm(50_000, device=device)[:rows], torch.randn(rows, dim, device=device)
    skip, steps = torch.tensor(False, device=device), torch.ones((), device=device)
    times = {}
    for blocks in [(v, w) for v in (256, 512, 1024) for w in (2, 4, 8)]:
        kernels.ADAM = blocks
        times[blocks] = timed(device, lambda: kernels.adam_rows(table, moments, picked, grad, skip, steps, 50_000,
                                                                1e-3, (0.9, 0.999), 1e-8))  # fmt: skip
    kernels.enabled, lazy = False, LazyAdam(table, 1e-3, spare=1)
    torch_us = timed(device, lambda: lazy.step(picked, grad, skip, weights=table.index_select(0, picked)))
    use_kernels("triton")  # the kernels again, in their blocks as shipped
    TUNED["ADAM"] = best = min(times, key=times.get)
    print(f"  Adam on {rows:,} rows: torch's gather, fused Adam and copies back {torch_us:.1f} us, shipped "
          f"{SHIPPED['ADAM']} {times[SHIPPED['ADAM']]:.1f} us, fastest {best} {times[best]:.1f} us")  # fmt: skip


def timed(device: str, work, runs: int = 50) -> float:
    """Microseconds a run of `work` takes on the device (CUDA events), after one run to warm it up."""
    work()
    sync(device)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        work()
    stop.record()
    sync(device)
    return start.elapsed_time(stop) / runs * 1e3


def train_rates(
    folder: Path, device: str, runs: list[tuple[int, int, int]], rate: float, dim: int = DIM, arms: tuple = ("",)
) -> None:
    """train.py's pairs/s at `dim` for each (batch, M, updates) of `runs` (the log windows after the first), against
    the exact-mining bound at `rate`, with each pooling of `arms`."""
    shard = folder / "pairs.h5"
    for (batch, m, count), arm in ((r, a) for r in runs for a in arms):
        for mode in ("paraphrase", "bitext"):
            use_kernels(arm)
            out = folder / f"run-{batch}-{m}-{mode}{arm}"
            train_run("--train-shards", shard, "--sp-model", folder / "sp.model", "--output-dir", out, "--dim", dim,
                      "--batch-size", batch, "--megabatch-size", m, "--megabatch-anneal", 0, "--max-steps", count,
                      "--log-every", m, "--mode", mode, "--device", device)  # fmt: skip
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            later = [r for r in records if r["event"] == "train"][1:]  # the first window holds the warm-up
            pairs_s = sum(r["pairs_per_s"] for r in later) / len(later)
            bound = mining_bound(rate, m, mode == "bitext", batch) * DIM / dim
            print(f"  batch {batch:4d}, M = {m:3d} {mode:10s}{used(arm)}: {pairs_s:10,.0f} pairs/s = {100 * pairs_s / bound:5.2f}% "
                  f"of the exact-mining bound at bf16's rate ({bound:,.0f} pairs/s); {count} updates")  # fmt: skip
            first, last = [r for r in records if r["event"] == "train"][0], later[-1]
            spent = {k: last[f"seconds_{k}"] - first[f"seconds_{k}"] for k in ("read", "mine", "update", "record")}
            print(f"    the host's seconds after the first window: read {spent['read']:.2f}, mine {spent['mine']:.2f}, "
                  f"update {spent['update']:.2f}, of which new step shapes (first run, recording) {spent['record']:.2f}; "
                  f"{last['shapes']} shapes in all, {last['shapes'] - first['shapes']} new after the first window")  # fmt: skip


def step_profile(folder: Path, device: str, runs: list[tuple[int, int, str]], dim: int, arms: tuple = ("",)) -> None:
    """Where a step's device time goes, by kernel, for each (batch, M, mode) of `runs`: train_rates' shard and model
    trained in process for 3 mega-batches, the third profiled (the first holds the warm-up and the graphs'
    recording; the final save is left out), so the figures are the steady state's, its mining included."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from paraphrastic import train

    for (batch, m, mode), arm in ((r, a) for r in runs for a in arms):
        use_kernels(arm)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        stamps = []
        with profile(activities=activities, schedule=schedule(wait=2 * m, warmup=0, active=m, repeat=1)) as prof:

            def each_step(trainer, prof=prof, stamps=stamps):
                prof.step()
                stamps.append(time.perf_counter())

            train.main(["--train-shards", str(folder / "pairs.h5"), "--sp-model", str(folder / "sp.model"),
                        "--output-dir", str(folder / f"profiled-{batch}-{mode}{arm}"), "--dim", str(dim), "--batch-size",
                        str(batch), "--megabatch-size", str(m), "--megabatch-anneal", "0", "--max-steps", str(3 * m),
                        "--mode", mode, "--device", device, "--quiet"], on_step=each_step)  # fmt: skip
        events = prof.key_averages()
        key = "self_cpu_time_total" if device != "cuda" else (
            "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total")  # fmt: skip
        kernels = [e for e in events if getattr(e, key) > 0 and not e.key.startswith("ProfilerStep")  # its marker
                   and (device != "cuda" or not e.key.startswith("aten::"))]  # fmt: skip
        busy = sum(getattr(e, key) for e in kernels) / 1e3 / m
        wall = 1e3 * (stamps[3 * m - 1] - stamps[2 * m - 1]) / m
        print(f"  batch {batch}, M = {m}, {mode}{used(arm)}, the third mega-batch: {wall:.3f} ms an update on the host's clock, "
              f"{busy:.3f} ms of it {'kernels' if device == 'cuda' else 'ops'} ({batch / wall * 1e3:,.0f} pairs/s), "
              f"{sum(e.count for e in kernels) / m:.0f} launches an update; the largest:")  # fmt: skip
        for e in sorted(kernels, key=lambda e: -getattr(e, key))[:12]:
            print(f"    {getattr(e, key) / 1e3 / m:8.4f} ms/update {e.count / m:6.1f}/update  {e.key[:90]}")
        device_gaps(prof, device, m)


def device_gaps(prof, device: str, m: int, largest: int = 6) -> None:
    """Where the device waits in the profiled window: its span from the first kernel to the last, the time no
    kernel runs, and the `largest` idle gaps with the kernels either side and the host's ops during each."""
    from torch.autograd import DeviceType

    events = prof.events()
    kernels = sorted(
        (e for e in events if e.device_type == DeviceType.CUDA and not e.name.startswith("ProfilerStep")),
        key=lambda e: e.time_range.start,
    )
    if device != "cuda" or not kernels:
        return
    gaps, end, busy = [], kernels[0].time_range.start, 0.0
    for before, k in zip([None, *kernels], kernels, strict=False):
        start, stop = k.time_range.start, k.time_range.end
        if start > end:
            gaps.append((start - end, end, start, before.name if before else "", k.name))
        busy += max(stop, end) - max(start, end)
        end = max(end, stop)
    span = end - kernels[0].time_range.start
    idle = span - busy
    small = sum(g[0] for g in gaps if g[0] < 20)
    print(f"  the device's span {span / 1e3 / m:.3f} ms an update: busy {busy / 1e3 / m:.3f}, idle {idle / 1e3 / m:.3f} "
          f"({100 * idle / span:.0f}%), of which gaps under 20 us {small / 1e3 / m:.3f} ({sum(g[0] < 20 for g in gaps) / m:.0f} an update)")  # fmt: skip
    host = [e for e in events if e.device_type == DeviceType.CPU]
    for length, lo, hi, before, after in sorted(gaps, reverse=True)[:largest]:
        during = {}
        for e in host:
            overlap = min(e.time_range.end, hi) - max(e.time_range.start, lo)
            if overlap > 0.2 * length and not e.name.startswith("ProfilerStep"):
                during[e.name] = during.get(e.name, 0) + overlap
        ops = ", ".join(f"{n[:40]} {t:.0f}" for n, t in sorted(during.items(), key=lambda x: -x[1])[:6])
        print(f"    gap {length:8.0f} us after {before[:40]!r}, before {after[:40]!r}; host: {ops}")


def embed_rates(folder: Path, lines: Path, device: str, threads: int) -> None:
    """paraphrastic-embed on `device` and on cpu, all cores, and the largest difference of their rows."""
    outs = {}
    for where in dict.fromkeys([device, "cpu"]):
        out = folder / f"vectors-{where}.npy"
        start = time.perf_counter()
        run(BIN / "paraphrastic-embed", "--sentence-file", lines, "--output-file", out, "--device", where,
            "--threads", threads, "--quiet")  # fmt: skip
        seconds = time.perf_counter() - start
        rows = np.load(out, mmap_mode="r")
        print(f"  {where:4s}, {threads} workers: {len(rows) / seconds:10,.0f} sentences/s end to end "
              f"({len(rows):,} lines, {seconds:.1f} s with start-up)")  # fmt: skip
        outs[where] = rows
    diff = float(np.max(np.abs(outs[device] - outs["cpu"])))
    print(f"  largest difference, {device} against cpu: {diff:.2e} (equal to float32 rounding: {diff < 1e-5})")


def every_core(lines: Path, core_lines: int, cores: int, full: bool) -> None:
    """bench_cores.py with 1 and all workers (all alone in a dry run): paraphrastic-embed and model.encode on
    `core_lines` lines, the limit N x sentencepiece beside them, and the start-up apart."""
    cmd = [sys.executable, ROOT / "benchmarks" / "bench_cores.py", "--text", lines, "--lines", core_lines,
           "--encode", core_lines, "--counts", f"1,{cores}" if full else cores, "--repeats", 1, "--skip-score",
           "--memory", "", "--startup-runs", 5 if full else 1]  # fmt: skip
    with subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, text=True) as done:  # its lines as they come
        next(done.stdout, None)  # its machine line: ours is printed above
        for line in done.stdout:
            print(f"  {line}", end="", flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench_cores.py ended with {done.returncode}")


def teacher_rate(device: str, sentences: int, layers: int = 6) -> None:
    """Sentences/s of a MiniLM-L6-shaped encoder (random weights; fewer `layers` in a dry run) on pre-tokenized
    input, fp32 and bf16 autocast."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=384, num_hidden_layers=layers, num_attention_heads=12, intermediate_size=1536)
    model = BertModel(config).to(device).eval()
    ids = torch.randint(1000, 30000, (sentences, 32), device=device)
    mask = torch.ones_like(ids)
    vectors = {}
    for bf16 in (False, True):
        with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            model(input_ids=ids[:256], attention_mask=mask[:256])  # warm-up
            sync(device)
            start, parts = time.perf_counter(), []
            for i in range(0, sentences, 256):
                hidden = model(input_ids=ids[i : i + 256], attention_mask=mask[i : i + 256]).last_hidden_state
                parts.append(hidden.float().mean(1))
            sync(device)
        took = time.perf_counter() - start
        vectors[bf16] = torch.cat(parts)
        print(f"  {device} {'bf16' if bf16 else 'fp32'}: {sentences / took:10,.0f} sentences/s")
    cos = torch.nn.functional.cosine_similarity(vectors[False], vectors[True])
    print(f"  bf16 against fp32: cosine min {float(cos.min()):.5f}, mean {float(cos.mean()):.5f}")


def equality(folder: Path, data: Path, device: str, updates: int, pairs: int | None, tasks: str) -> None:
    """score and evaluate (`tasks`) on `device` against cpu, and a short training run of `updates` on each, on the
    first `pairs` caption pairs."""
    pairs, vocab = caption_pairs(folder, data, pairs)
    scores = {}
    for where in dict.fromkeys([device, "cpu"]):
        done = run(BIN / "paraphrastic-score", "--sentence-pair-file", pairs, "--device", where, "--quiet")
        scores[where] = np.array([float(line.rsplit("\t", 1)[1]) for line in done.stdout.splitlines()])
    print(
        f"  score: {len(scores['cpu']):,} pairs, largest difference {np.max(np.abs(scores[device] - scores['cpu'])):.2e}"
    )
    tables = {}
    for where in dict.fromkeys([device, "cpu"]):
        done = run(BIN / "paraphrastic-evaluate", "--data-dir", data, "--tasks", tasks, "--device", where)
        tables[where] = [line for line in done.stdout.splitlines() if "evaluated in" not in line]
    print(f"  evaluate ({tasks}): {device} table equal to cpu's: {tables[device] == tables['cpu']}")
    dev = data / "sts" / "en" / "stsb" / "dev.tsv"
    figures, sp = {}, []  # sentencepiece trained once, by the first run: the others take its model
    for where in dict.fromkeys([device, "cpu"]):
        out = folder / f"short-{where}"
        train_run("--train-file", pairs, "--output-dir", out, "--dim", 128, "--vocab-size", vocab,
            "--batch-size", 128, "--megabatch-size", 1, "--max-steps", updates, "--save-every", updates, "--dev-file", dev,
            "--device", where, "--seed", 1, "--threads", 2, *sp)  # fmt: skip
        sp = sp or ["--sp-model", out / "sp.model"]
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        figures[where] = [r for r in records if r["event"] == "dev"][-1]["mean"]
    print(f"  short training run ({updates} updates, dim 128, M = 1): STSb dev Pearson {device} {figures[device]:.2f}, "
          f"cpu {figures['cpu']:.2f}")  # fmt: skip


def caption_pairs(folder: Path, data: Path, pairs: int | None) -> tuple[Path, int]:
    """The first `pairs` caption pairs of the carried data, written to `folder`, and a vocabulary size for them."""
    lines = data.joinpath("pairs.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[:pairs]
    path = folder / "pairs.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    return path, 4000 if len(lines) > 10_000 else 1000


def resumed(folder: Path, data: Path, device: str, updates: int, pairs: int | None) -> None:
    """A run of `updates` on `device` stopped at half of them and resumed, against the straight run, bit for bit."""
    pairs, vocab = caption_pairs(folder, data, pairs)
    common = ["--train-file", pairs, "--vocab-size", vocab, "--dim", 128, "--batch-size", 128, "--megabatch-size", 10,
              "--megabatch-anneal", 0, "--save-every", updates // 3, "--device", device, "--seed", 1, "--threads", 2]  # fmt: skip
    # a CPU's sums follow the thread count, and the default count follows the machine's load: fixed above
    train_run(*common, "--output-dir", folder / "straight", "--max-steps", updates)
    sp = ["--sp-model", folder / "straight" / "sp.model"]  # the same pieces for both runs
    train_run(*common, *sp, "--output-dir", folder / "resumed", "--max-steps", updates // 2)
    train_run(*common, *sp, "--output-dir", folder / "resumed", "--max-steps", updates, "--resume")
    a, b = (torch.load(folder / run_ / "model.pt", weights_only=True)["embedding"] for run_ in ("straight", "resumed"))
    print(f"  stopped at update {updates // 2} and resumed to {updates}, M = 10, {device}: equal to the straight run "
          f"bit for bit: {torch.equal(a, b)} (largest difference {float((a.float() - b.float()).abs().max()):.2e})")  # fmt: skip


def pack_data(shared: Path, out: Path, lines: int = 100_000, pairs: int = 20_000) -> None:
    """Copy what the check reads out of ../shared/data (a few MiB) into `out`, to carry to the GPU machine."""
    import gzip

    from paraphrastic.teacher import english_training_sentences

    out.mkdir(parents=True, exist_ok=True)
    (out / "lines.txt").write_text("\n".join(english_training_sentences(shared)[:lines]) + "\n", encoding="utf-8")
    with gzip.open(shared / "train" / "en_paraphrase" / "multi30k_task2_en_captions.pairs.tsv.gz", "rt") as f:
        (out / "pairs.tsv").write_text("".join(next(f) for _ in range(pairs)), encoding="utf-8")
    for part in ["sts/en/2012", "sts/en/2013", "sts/en/2014", "sts/en/2015", "sts/en/2016", "sts/en/stsb"]:
        shutil.copytree(shared / part, out / part, dirs_exist_ok=True)
    (out / "sts" / "en" / "stsb" / "train.tsv").unlink(missing_ok=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="the carried files (made with --pack)")
    p.add_argument("--pack", type=Path, help="first copy them out of this ../shared/data, then stop")
    p.add_argument("--dry-run", action="store_true", help="cpu instead of cuda, less work: a test of the script")
    p.add_argument("--embed-lines", type=int, default=2_000_000, help="lines embedded on cuda and cpu")
    p.add_argument("--core-lines", type=int, default=8_000_000, help="lines for the every-core part")
    p.add_argument("--parts", default=",".join(PARTS), help="the parts to run, in this order (default: all)")
    p.add_argument("--runs", help="train's runs as BATCHxMxUPDATES,... (default: 128x100x1500,128x10x400,"
                   "512x100x400,1024x100x200)")  # fmt: skip
    p.add_argument("--kernel-arms", help="train and profile each run with each of these ops: torch (embedding_bag, "
                   "fused Adam), triton (kernels.py's, as shipped), tuned (in the kernels part's fastest blocks)")  # fmt: skip
    args = p.parse_args()
    if args.pack:
        return pack_data(args.pack, args.data)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here (--dry-run runs the check on the CPU)")
    cores = len(os.sched_getaffinity(0))
    print(machine_header())
    if device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    full = device == "cuda"  # else a dry run: every part, a little of each
    n = 8192 if full else 256
    rates = {
        name: product_rate(device, dtype, n) for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    print(f"matrix products ({n}^3): fp32 {rates['fp32'] / 1e12:.1f} TFLOP/s, bf16 {rates['bf16'] / 1e12:.1f} TFLOP/s")
    runs = [(BATCH, 100, 1500), (BATCH, 10, 400), (512, 100, 400), (1024, 100, 200)] if full else [(BATCH, 2, 4)]
    if args.runs:
        runs = [tuple(int(v) for v in run_.split("x")) for run_ in args.runs.split(",")]
    arms = tuple(args.kernel_arms.split(",")) if args.kernel_arms else ("",)
    profiled = [(BATCH, 100, "bitext"), (512, 100, "paraphrase")] if full else [(BATCH, 2, "bitext")]
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        p.error(f"--parts: no part named {', '.join(sorted(set(parts) - set(PARTS)))}; the parts: {', '.join(PARTS)}")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        folder = Path(tmp)
        dim = DIM if full else 64
        if {"kernels", "train", "profile"} & set(parts):
            most = [b * (3 * m + c) for b, m, c in runs if "train" in parts] + [3 * b * m for b, m, _ in profiled]
            training_data(folder, max(most))
        for part in parts:  # in the order asked, so that a call cut short still has the first ones
            if part == "train":
                section(f"train.py, dim {dim}, synthetic shards, {device}:", train_rates, folder, device, runs,
                        rates["bf16"], dim, arms)  # fmt: skip
            elif part == "resume":
                section(f"stopped and resumed on {device}:", resumed, folder, args.data, device,
                        *((150, None) if full else (24, 3000)))  # fmt: skip
            elif part == "cores":
                section(f"every core, {cores} workers against 1:", every_core, args.data / "lines.txt",
                        args.core_lines if full else 4_000, cores, full)  # fmt: skip
            elif part == "kernels":
                section("kernels.py's kernels, each block size:", tune_kernels, folder, device, dim)
            elif part == "profile":
                section("where a step's time goes (profiled):", step_profile, folder, device, profiled, dim, arms)
            elif part == "equal":
                checks = (300, None, "sts,stsb") if full else (24, 3000, "stsb")
                section(f"{device} against cpu:", equality, folder, args.data, device, *checks)
            elif part == "embed":
                lines = folder / "lines.txt"
                sentences = args.data.joinpath("lines.txt").read_text(encoding="utf-8").splitlines()
                count = args.embed_lines if full else 5_000
                write_repeated(lines, sentences, count)
                section("paraphrastic-embed, the shipped English model:", embed_rates, folder, lines, device, cores)
            elif part == "teacher":
                section("a teacher's forward pass:", teacher_rate, device, *((20_000, 6) if full else (16, 1)))


if __name__ == "__main__":
    main()
