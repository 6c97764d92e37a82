"""Every core: end-to-end throughput against the number of worker processes, and memory against input size.

    python benchmarks/bench_cores.py [--lines 2000000] [--encode 1000000] [--memory 100000,5000000]

For 1, 2, 4, ... up to the machine's cores, with the shipped English model: `paraphrastic-embed --threads N` on
--lines lines (wall clock of the whole command: start-up, reading, the written .npy), `paraphrastic-score --threads
N` on as many pairs, and `model.encode` on --encode sentences with N workers (until it returns its rows; freeing
them, starting its workers, and where their time went are printed apart, and each round ends with encode at the most
workers pooling the model file's int8 rows); beside them the limit N x (sentencepiece alone on one thread, same
lines), N processes of sentencepiece alone at once (what the machine's cores really give it), the fraction of the
limit reached, and the speed-up over N = 1, each the median of --repeats rounds (each round printed as it ends, and
each round's own speed-up of the most workers). Before the rounds: the disk's own limit (writing and syncing the
output's bytes, at most 2 GiB), N processes of a worker's own work at once (sentencepiece, pooling, the rows: what
the cores give the whole job), its rows kept, written into a file of each job's own as the workers write them, or
into one shared file as they wrote before, kept with a smaller batch, and kept, pooled from the int8 rows, and the
microseconds a text spends in each part of the job (piece ids, pooling, rows written) in N processes at once; and N
processes writing blocks into memory files at once, into one file or files of their own, with pwrite or through a
mapping. After them, the start-up (the whole command on the 10-line example) and the peak anonymous memory (Pss_Anon
of the command and its workers, the output's file pages aside) of `paraphrastic-embed` on each --memory size. The
lines are the fixed English sentence sample of ../shared/data, repeated to the size asked (or --text's lines, on a
machine without ../shared/data). --skip-embed and --skip-score leave those commands out; --startup-only prints the
start-up alone, and each console command's --help beside it.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import ROOT, children, cpu_name, english_sentences, machine_header, write_repeated

import paraphrastic
from paraphrastic import fileio, models, static, workers

BIN = Path(sys.executable).parent


def write_lines(path: Path, n: int, source: Path | None = None) -> list[str]:
    """`n` lines of the fixed English sample (or of `source`'s lines), repeated as needed, written to `path`."""
    sentences = source.read_text(encoding="utf-8").splitlines() if source else english_sentences()
    return write_repeated(path, sentences, n)


def core_counts(cores: int) -> list[int]:
    counts, k = [], 1
    while k < cores:
        counts.append(k)
        k *= 2
    return counts + [cores]


def anon_kib(pid: int) -> int:
    """Anonymous memory of a process and its children in KiB, by proportional share (Pss_Anon: a page the forked
    workers share with their parent counts once, not once a process), 0 once they are gone."""
    total = 0
    for p in [pid, *children(pid)]:
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss_Anon:")), 0)
    return total


def timed(cmd: list[str], sample: float | None = None) -> tuple[float, int, tuple[float, float] | None]:
    """(wall seconds, peak anonymous KiB of the process tree, read every `sample` seconds, else 0, and when it
    started worker processes the seconds before the first and after the last was gone) of a command that must
    succeed (the throughput runs read no memory: the reading would take a core's share)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, first, gone = 0, None, None
    while proc.poll() is None:
        if sample:
            peak = max(peak, anon_kib(proc.pid))
        working = bool(children(proc.pid))
        first = first or (time.perf_counter() if working else None)
        gone = None if working else gone or time.perf_counter()
        time.sleep(sample or 0.01)
    end = time.perf_counter()
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.read()[-2000:]}")
    return end - start, peak, (first - start, end - (gone or end)) if first else None


def tokenize_seconds(tokenizer, sample: list[str], threads: int = 1) -> float:
    """Seconds a tokenizer (sentencepiece with its lowercasing) takes over `sample`, 65,536 texts a call."""
    start = time.perf_counter()
    for i in range(0, len(sample), 65536):
        tokenizer.encode(sample[i : i + 65536], num_threads=threads)
    return time.perf_counter() - start


def sentencepiece_alone(lines: list[str], threads: int = 1) -> float:
    """Sentences/s of the shipped model's sentencepiece (with its lowercasing) on `threads` of its own threads."""
    sample = lines[:400_000]
    return len(sample) / tokenize_seconds(paraphrastic.load_encoder().tokenizer, sample, threads)


_AT_ONCE: tuple = ()  # (work, barrier) for the forked processes of processes_run


def _timed_at_once(k: int) -> tuple[float, object]:
    work, barrier = _AT_ONCE
    barrier.wait()  # every process starts together, so none runs on a core left idle
    start = time.perf_counter()
    done = work(k)
    return time.perf_counter() - start, done


def processes_run(work, n: int) -> list[tuple[float, object]]:
    """(seconds, what it gave) of each of `n` forked processes running work(k), k = 0..n-1, all at once."""
    global _AT_ONCE
    fork = multiprocessing.get_context("fork")
    _AT_ONCE = (work, fork.Barrier(n))
    with fork.Pool(n) as pool:
        return pool.map(_timed_at_once, range(n), chunksize=1)


def processes_rate(work, texts: int, n: int) -> float:
    """Texts/s of `n` forked processes running work(k), k = 0..n-1, over `texts` texts each, all at once: what n
    cores of this machine give that work (shared caches and memory, SMT siblings, clocks), where n x one is the
    ideal."""
    return n * texts / max(seconds for seconds, _ in processes_run(work, n))


def sentencepiece_processes(lines: list[str], n: int) -> float:
    """Sentences/s of `n` processes of the shipped model's sentencepiece alone on the same lines, all at once: the
    ceiling of n workers."""
    tokenizer, sample = paraphrastic.load_encoder().tokenizer, lines[:200_000]
    return processes_rate(lambda _: tokenize_seconds(tokenizer, sample), len(sample), n)


WAYS = ("kept in its own memory", "written into a memory file of the job's own (pwrite, as the workers do)",
        "written into one memory file all share (pwrite, as the workers did before)",
        "kept, embedded 1,024 texts a batch (not 8,192)",
        "kept, pooled from the int8 rows (a quarter of the table's bytes)")  # fmt: skip


def int8_pooling(model: models.SPModel) -> tuple:
    """An `embed_tokens` for `model` (the shipped one) that pools from its file's int8 rows with torch's 8-bit row
    kernel, and whether it gives the float table's bits on a sample. A row is int8 values times a bfloat16 scale,
    exact in float32, so the sums match; the table it reads is 21 MB, not 82 MB."""
    state = models._safe_load(models.existing_model(None))
    q, scale = state["embedding"], state["embedding_scale"].float()
    biased = (q.to(torch.int16) + 128).to(torch.uint8)  # the kernel's rows: uint8 times scale plus a bias
    packed = torch.cat([biased, torch.cat([scale, -128 * scale], 1).view(torch.uint8)], 1).contiguous()

    def embed_tokens(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        bags = model.rows_and_offsets(flat, lengths)
        sums = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(packed, *bags, False, 0, False, None, None)
        return (sums / bags.lengths()[:, None]).numpy()

    sample = model.token_ids([f"{i} sentences, one of them the {i}th." for i in range(1_000)])
    return embed_tokens, np.array_equal(embed_tokens(*sample), model.embed_tokens(*sample))


def _embed_alone(model, sample: list[str], way: int, shared: tuple, k: int) -> None:
    """As a worker, on one thread: embed `sample` one job's texts at a time, its rows as WAYS[way] says (`shared`:
    the memory file all share, and the int8 pooling's `embed_tokens`). A job's own file stays open, as a worker's
    does until the caller has placed its rows."""
    workers.use_threads(1)
    if way == 4:
        model.embed_tokens = shared[1]
    for at in range(0, len(sample), static.JOB_TEXTS):
        rows = model.embed_here(sample[at : at + static.JOB_TEXTS], 1024 if way == 3 else 8192)
        if way == 1:
            fileio.write_at(os.memfd_create("bench-cores"), rows, 0)
        elif way == 2:
            fileio.write_at(shared[0], rows, (k * len(sample) + at) * rows.shape[1] * 4)


def job_processes(lines: list[str], n: int, model: models.SPModel, int8_tokens) -> list[float]:
    """Sentences/s of `n` processes each embedding the same lines in itself with `model` (the one `model.encode` is
    timed on, warmed up before the fork as in the workers; `int8_tokens`: its int8 pooling), all at once (a
    worker's own work: sentencepiece, pooling, the rows), once for each of WAYS: beside sentencepiece_processes,
    what the pooling, the shared output and the batch's memory lose as cores are added."""
    sample = lines[:200_000]
    rates = []
    for way in range(len(WAYS)):
        shared = os.memfd_create("bench-cores")
        try:
            job = functools.partial(_embed_alone, model, sample, way, (shared, int8_tokens))
            rates.append(processes_rate(job, len(sample), n))
        finally:
            os.close(shared)
    return rates


def _job_phases(model, sample: list[str], k: int) -> list[float]:
    """As a worker, on one thread: the seconds a job's parts take over `sample`, one job's texts at a time: the
    piece ids, the pooling, the rows written into a memory file of the job's own."""
    workers.use_threads(1)
    spent = [0.0, 0.0, 0.0]
    for at in range(0, len(sample), static.JOB_TEXTS):
        start = time.perf_counter()
        ids = model.token_ids(sample[at : at + static.JOB_TEXTS])
        tokenized = time.perf_counter()
        rows = model.embed_tokens(*ids)
        pooled = time.perf_counter()
        fd = os.memfd_create("bench-cores")
        fileio.write_at(fd, rows, 0)
        os.close(fd)
        for part, took in enumerate((tokenized - start, pooled - tokenized, time.perf_counter() - pooled)):
            spent[part] += took
    return spent


def job_phases(lines: list[str], n: int, model: models.SPModel) -> list[float]:
    """Microseconds a text of a worker's job spends in each part (`_job_phases`; the mean over `n` processes at
    once): the part that grows from 1 to N processes is the one the cores share."""
    sample = lines[:200_000]
    runs = processes_run(functools.partial(_job_phases, model, sample), n)
    return [1e6 * statistics.mean(spent[part] for _, spent in runs) / len(sample) for part in range(3)]


BLOCK = 8 << 20  # bytes a job of 8,192 rows of 256 floats writes


def _write_blocks(paths: list[Path], blocks: int, mapped: bool, k: int) -> None:
    """Write `blocks` blocks at this process's place in its file (paths[k]), with pwrite or through a mapping."""
    data, at = np.frombuffer(os.urandom(BLOCK), dtype=np.uint8), k * blocks * BLOCK
    with open(paths[k], "r+b") as f:
        if mapped:
            view = np.memmap(f, dtype=np.uint8, mode="r+")
            for i in range(blocks):
                view[at + i * BLOCK : at + (i + 1) * BLOCK] = data
        else:
            for i in range(blocks):
                os.pwrite(f.fileno(), data, at + i * BLOCK)


def write_rates(n: int, blocks: int = 25) -> list[float]:
    """Bytes/s of `n` processes at once each writing `blocks` blocks of BLOCK bytes into memory files (memfd, as
    the workers' shared rows): into one shared file with pwrite, into it through a shared mapping, and into files
    of their own with pwrite. A write holds its file's lock, so the first is what one file lets through."""
    rates = []
    for own, mapped in ((False, False), (False, True), (True, False)):
        fds = [os.memfd_create("bench-cores") for _ in range(n if own else 1)]
        paths = [Path(f"/proc/{os.getpid()}/fd/{fds[k if own else 0]}") for k in range(n)]
        try:
            for fd in fds:
                os.ftruncate(fd, n * blocks * BLOCK)
            rates.append(processes_rate(functools.partial(_write_blocks, paths, blocks, mapped), blocks * BLOCK, n))
        finally:
            for fd in fds:
                os.close(fd)
    return rates


def disk_rate(folder: Path, size: int) -> float:
    """Bytes/s of writing `size` bytes to a new file in `folder` and syncing them, as embed writes its output: the
    end-to-end limit whatever the cores (embed's output must be on disk before it is published)."""
    block, path = os.urandom(4 << 20), folder / "disk-alone.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for at in range(0, size, len(block)):
            f.write(block[: size - at])
        f.flush()
        os.fdatasync(f.fileno())
    took = time.perf_counter() - start
    path.unlink()
    return size / took


ENCODE = """
import os, sys, time, torch
from paraphrastic import models, static, workers
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()[: int(sys.argv[2])]
torch.set_num_threads(int(sys.argv[3]))
model = models.load_model()
if sys.argv[4:] == ["int8"]:  # pooled from the model file's int8 rows (run in benchmarks/, where bench_cores is)
    from bench_cores import int8_pooling
    model.embed_tokens = int8_pooling(model)[0]
embed_job, pool_map, spans = static._embed_job, workers.Workers.map, []

def timed_job(model, job):  # in a worker: when its job ran, by the clock every process shares
    start = time.monotonic()
    embed_job(model, job)
    return os.getpid(), start, time.monotonic()

def map_keeping(pool, fn, jobs):  # in the caller: each job's span, as it comes back
    for result in pool_map(pool, fn, jobs):
        spans.append(result)
        yield result

static._embed_job, workers.Workers.map = timed_job, map_keeping
start = time.monotonic()
rows = model.encode(lines)
returned = time.monotonic()
del rows
freed = time.monotonic()
with workers.Workers(model, given=lines) as pool:
    pool.start(wait=True)
    forked = time.monotonic()
last = {}
for pid, _, end in spans:
    last[pid] = max(end, last.get(pid, end))
first = min((begin for _, begin, _ in spans), default=start) - start
busy = sum(end - begin for _, begin, end in spans)
spread = max(last.values()) - min(last.values()) if last else 0.0
ended = returned - max(last.values(), default=returned)  # the last rows placed, the workers stopped and waited for
print(len(lines) / (returned - start), freed - returned, forked - freed, first, busy, spread, ended)
"""


def encode_figures(n: int, text: Path, count: int, int8: bool = False) -> list[float]:
    """ENCODE's seven figures for `count` texts with `n` threads (cli_rates says which); `int8`: pooled from the
    model file's int8 rows."""
    extra = ["int8"] if int8 else []
    done = subprocess.run([sys.executable, "-c", ENCODE, str(Path(text).resolve()), str(count), str(n), *extra],
                          capture_output=True, text=True, check=True, cwd=Path(__file__).parent)  # fmt: skip
    return [float(x) for x in done.stdout.split()[-7:]]


def cli_rates(n: int, text: Path, pairs: Path, tmp: Path, args) -> tuple:
    """(embed CLI sentences/s, score CLI pairs/s, model.encode sentences/s until it returns, embed's seconds before its
    workers started and after they ended or None with one worker, the seconds that freeing encode's rows took, and
    that starting encode's workers takes with its texts held, until each has said so; then, of encode's jobs, the
    seconds from its call to the first job's start, the seconds of all jobs together, the seconds between the
    first worker's last job ending and the last worker's, and from the last job's end to encode's return: all 0
    with one worker) with `n` workers. The last round's outputs are removed first, outside the clock: replacing a
    file of gigabytes frees its blocks in the rename (seconds, on a disk mounted with discard), a cost of the old
    file, not of this run."""
    for old in (tmp / "out.npy", tmp / "out.tsv"):
        old.unlink(missing_ok=True)
    embed_s, parts = float("nan"), None
    if not args.skip_embed:
        embed_s, _, parts = timed([str(BIN / "paraphrastic-embed"), "--sentence-file", str(text), "--output-file",
                                   str(tmp / "out.npy"), "--threads", str(n), "--quiet"])  # fmt: skip
    score_s = float("nan") if args.skip_score else timed(
        [str(BIN / "paraphrastic-score"), "--sentence-pair-file", str(pairs), "--output-file",
         str(tmp / "out.tsv"), "--threads", str(n), "--quiet"])[0]  # fmt: skip
    encode = encode_figures(n, text, args.encode) if args.encode else [float("nan")] * 7
    return args.lines / embed_s, args.lines / score_s, encode[0], parts, *encode[1:]


COMMANDS = ["paraphrastic-embed", "paraphrastic-score", "paraphrastic-mine", "paraphrastic-evaluate",
            "paraphrastic-train", "paraphrastic-export", "paraphrastic-demo"]  # fmt: skip


PARTS = """
import time
start = time.perf_counter()
import paraphrastic.embed_sentences
imported = time.perf_counter()
paraphrastic.load_encoder()
print(imported - start, time.perf_counter() - imported)
"""


def startup(tmp: Path, count: int = 5, threads: int | None = None) -> str:
    """The whole-command wall time of `paraphrastic-embed` on the 10-line example (with --threads `threads`),
    median of `count` runs, the medians of its first two parts, timed in a process of their own: the imports
    and loading the model, and the floor beside it: a Python that imports numpy and sentencepiece, nothing else."""
    example = ROOT / "data" / "example-sentences.txt"
    given = ["--threads", str(threads)] if threads else []
    runs = [timed([str(BIN / "paraphrastic-embed"), "--sentence-file", str(example), "--output-file",
                   str(tmp / "example.npy"), "--quiet", *given])[0] for _ in range(count)]  # fmt: skip
    parts = [subprocess.run([sys.executable, "-c", PARTS], capture_output=True, text=True, check=True).stdout.split()
             for _ in range(count)]  # fmt: skip
    imports, load = (statistics.median(float(part[k]) for part in parts) for k in range(2))
    floor = statistics.median(timed([sys.executable, "-c", "import numpy, sentencepiece"])[0] for _ in range(count))
    whole = statistics.median(runs)
    return (f"paraphrastic-embed on data/example-sentences.txt, median of {count}: {whole:.2f} s "
            f"(of which its imports {imports:.2f} s, loading the model {load:.2f} s); the floor, "
            f"python -c 'import numpy, sentencepiece': {floor:.2f} s, so {whole / floor:.1f}x the floor")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=2_000_000, help="lines for the command-line runs")
    p.add_argument("--encode", type=int, default=1_000_000, help="sentences for model.encode (0: leave it out)")
    p.add_argument("--memory", default="100000,5000000", help="input sizes for the memory check")
    p.add_argument("--text", type=Path, help="take the lines from this file instead (a machine without the data)")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="largest worker count")
    p.add_argument("--skip-score", action="store_true", help="leave out paraphrastic-score (a shorter run)")
    p.add_argument("--skip-embed", action="store_true", help="leave out paraphrastic-embed (model.encode alone)")
    p.add_argument("--counts", help="worker counts to run, comma-separated (default 1, 2, 4, ... up to --cores)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of all worker counts; medians are printed")
    p.add_argument("--startup-only", action="store_true", help="print the start-up figures alone")
    p.add_argument("--startup-runs", type=int, default=5, help="runs of the start-up figure (its median)")
    args = p.parse_args()
    if args.startup_only:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"{machine_header()}\nstart-up: {startup(Path(tmp), args.startup_runs)}")
            print(
                f"start-up with --threads 16 (a 16-core machine's default): {startup(Path(tmp), args.startup_runs, 16)}"
            )
        for command in COMMANDS:
            runs = [timed([str(BIN / command), "--help"])[0] for _ in range(args.startup_runs)]
            print(f"  {command} --help, median of {args.startup_runs}: {statistics.median(runs):.2f} s")
        return
    print(machine_header())
    print(f"cpu: {cpu_name()}, {args.cores} cores used")
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
        tmp = Path(tmp)
        text, pairs = tmp / "lines.txt", tmp / "pairs.txt"
        lines = write_lines(text, args.lines, args.text)
        pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(lines, lines[1:] + lines[:1], strict=True)))
        single = sentencepiece_alone(lines)
        own = sentencepiece_alone(lines, args.cores)
        print(f"sentencepiece alone: 1 thread {single:,.0f} sentences/s; its own {args.cores} threads {own:,.0f} "
              f"({own / single:.1f}x: what the tokenizer itself gains from the cores)")  # fmt: skip
        row_bytes = paraphrastic.load_encoder().dim * 4
        size = min(args.lines * row_bytes, 2 << 30)
        disk = disk_rate(tmp, size)
        print(f"the disk alone: {disk / 1e6:,.0f} MB/s writing and syncing {size / 2**30:.1f} GiB in the output's "
              f"folder, so at most {disk / row_bytes:,.0f} rows/s of {row_bytes} bytes, whatever the cores\n")  # fmt: skip
        counts = [int(n) for n in args.counts.split(",")] if args.counts else core_counts(args.cores)
        # the short tables first: a run cut off by a device call's limit loses rounds, each printed as it ends
        ways = ", ".join(f"({k + 1}) {way}" for k, way in enumerate(WAYS))
        model = models.load_model()
        model.warm_up()  # what a first embedding loads is loaded before the fork, as in the workers
        int8_tokens, same = int8_pooling(model)
        print(f"a worker's own job in N processes at once (sentences/s; {min(len(lines), 200_000):,} lines each, "
              f"one job's texts at a time), its rows {ways} ((5) gives the float table's bits: {same}):\n\n"
              "| workers | "
              + " | ".join(f"({k + 1})" for k in range(len(WAYS))) + " |\n|---|" + "---|" * len(WAYS))  # fmt: skip
        jobs = {n: job_processes(lines, n, model, int8_tokens) for n in sorted({1, *counts})}
        for n in counts:
            print(f"| {n} | " + " | ".join(f"{x:,.0f} ({x / jobs[1][k]:.1f}x)" for k, x in enumerate(jobs[n])) + " |")
        print("\nthe parts of a worker's job in N processes at once (microseconds a text, the mean of the processes): "
              "its piece ids (sentencepiece), its pooling, its rows written into a memory file of the job's own\n\n"
              "| workers | piece ids | pooling | rows written |\n|---|---|---|---|")  # fmt: skip
        for n in sorted({1, *counts}):
            print(f"| {n} | " + " | ".join(f"{x:.2f}" for x in job_phases(lines, n, model)) + " |")
        del model, int8_tokens
        print("\nN processes at once writing 8 MiB blocks into memory files (memfd; GB/s): (a) into one shared file "
              "with pwrite, (b) into it through a shared mapping, (c) into files of their own with pwrite\n\n"
              "| processes | (a) | (b) | (c) |\n|---|---|---|---|")  # fmt: skip
        for n in sorted({1, *counts}):
            print(f"| {n} | " + " | ".join(f"{x / 1e9:.2f}" for x in write_rates(n)) + " |")
        print()
        rounds, int8 = [], []
        for _ in range(args.repeats):  # each round: every count in turn, then the most workers pooling int8 rows
            rounds.append({n: cli_rates(n, text, pairs, tmp, args) for n in counts})
            if args.encode and len(counts) > 1:
                int8.append(encode_figures(counts[-1], text, args.encode, int8=True)[0])
            done = {n: ", ".join(f"{name} {x:,.0f}" for name, x in zip(("embed", "score", "encode"), rates[:3],
                    strict=True) if not np.isnan(x)) for n, rates in rounds[-1].items()}  # fmt: skip
            print(f"round {len(rounds)} (sentences/s): " + "; ".join(f"{n} workers: {x}" for n, x in done.items())
                  + (f"; encode pooling int8 rows, {counts[-1]} workers: {int8[-1]:,.0f}" if int8 else ""), flush=True)  # fmt: skip
        print(f"each figure the median of {args.repeats} rounds, every round all worker counts in turn; a speed-up is "
              "the median of the rounds' own ratios to 1 worker\n")  # fmt: skip
        print(
            "| workers | embed CLI (sent/s) | score CLI (pairs/s) | model.encode (sent/s) | limit N x sentencepiece "
            "| sentencepiece in N processes | embed / limit | embed speed-up | score speed-up | encode speed-up |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        at_once = {n: sentencepiece_processes(lines, n) for n in sorted({1, *counts})}
        for n in counts:
            rates = [statistics.median(r[n][k] for r in rounds) for k in range(3)]
            ups = " | ".join(f"{statistics.median(r[n][k] / r[counts[0]][k] for r in rounds):.2f}x" for k in range(3))
            limit = n * single
            print(f"| {n} | {rates[0]:,.0f} | {rates[1]:,.0f} | {rates[2]:,.0f} | {limit:,.0f} | {at_once[n]:,.0f} "
                  f"({at_once[n] / at_once[1]:.1f}x) | {rates[0] / limit:.0%} | {ups} |", flush=True)  # fmt: skip
        for k, name in enumerate(("embed", "score", "encode")):
            each = [r[counts[-1]][k] / r[counts[0]][k] for r in rounds]
            if len(counts) > 1 and not np.isnan(each).any():
                print(f"{name} speed-up of {counts[-1]} workers, each round: {', '.join(f'{x:.2f}x' for x in each)}")
        if args.encode:  # a caller frees the rows when done with them: apart from encode's clock, shown here
            for k, what in ((4, "its rows freed after it returned"), (5, "its workers started with its texts held")):
                each = (f"{n} workers {statistics.median(r[n][k] for r in rounds):.2f}" for n in counts)
                print(f"encode, {what} (seconds, median): {', '.join(each)}")
            if len(counts) > 1:
                with_free = [(args.encode / r[counts[0]][2] + r[counts[0]][4]) / (args.encode / r[counts[-1]][2]
                             + r[counts[-1]][4]) for r in rounds]  # fmt: skip
                print(f"encode speed-up of {counts[-1]} workers with freeing its rows inside the clock, each round: "
                      + ", ".join(f"{x:.2f}x" for x in with_free))  # fmt: skip
            if int8:
                each = ", ".join(f"{x:,.0f} ({x / r[counts[-1]][2]:.2f}x)" for x, r in zip(int8, rounds, strict=True))
                print(f"encode with {counts[-1]} workers pooling the model file's int8 rows (torch's 8-bit kernel, the "
                      f"same bits), sentences/s and over the float table's rate in the same round: {each}")  # fmt: skip
            one = statistics.median(args.encode / r[1][2] for r in rounds) if 1 in counts else None
            print(
                "encode's workers at work (medians): the first job's start after the call, all jobs' seconds "
                "together (and over the one-thread run's seconds, where it ran), the last worker done after the first, "
                "encode's return after the last job's end (its last rows placed, its workers stopped)"
            )
            for n in (n for n in counts if n > 1):
                first, busy, spread, ended = (statistics.median(r[n][k] for r in rounds) for k in (6, 7, 8, 9))
                over = f" ({busy / one:.2f}x)" if one else ""
                print(f"  {n} workers: first job after {first:.2f} s, jobs {busy:.1f} s{over}, last done {spread:.2f} s "
                      f"after the first, returned {ended:.2f} s after the last job's end")  # fmt: skip
        if not args.skip_embed:
            print("\nembed's run in parts (medians, seconds): before its workers start (start-up), with them "
                  "(planning the input as they start, the rows, publishing the output), after they end\n\n"
                  "| workers | before | with workers | after |\n|---|---|---|---|")  # fmt: skip
            for n in counts:
                parts = [r[n][3] for r in rounds if r[n][3]]
                if parts:
                    before, after = (statistics.median(part[k] for part in parts) for k in range(2))
                    working = statistics.median(args.lines / r[n][0] for r in rounds) - before - after
                    print(f"| {n} | {before:.2f} | {working:.2f} | {after:.2f} |")
                else:
                    print(f"| {n} | (one process: no workers) | | |")
        print(f"\nstart-up: {startup(tmp, args.startup_runs)}")
        sizes = [int(size) for size in args.memory.split(",") if size]
        if sizes:
            print("\npeak anonymous memory of paraphrastic-embed (the command and its workers, Pss_Anon; the output's "
                  "pages aside):")  # fmt: skip
        for size in sizes:
            write_lines(text, size, args.text)
            seconds, peak, _ = timed([str(BIN / "paraphrastic-embed"), "--sentence-file", str(text), "--output-file",
                                   str(tmp / "out.npy"), "--threads", str(args.cores), "--quiet"], sample=0.05)  # fmt: skip
            rows = np.load(tmp / "out.npy", mmap_mode="r").shape[0]
            print(f"  {size:>10,} lines: {peak / 1024:,.0f} MiB anonymous, {seconds:.1f} s, {rows:,} rows written "
                  f"({args.cores} workers)")  # fmt: skip
            (tmp / "out.npy").unlink()


if __name__ == "__main__":
    main()
