"""--engine ray against the multi-core paraphrastic-embed, on the same lines, in the same run.

    python benchmarks/bench_ray.py [--sizes 200000,2000000] [--files 16] [--repeats 3]

For each size: the fixed English sentence sample of ../shared/data repeated to that many lines and cut into
--files files (half of them gzip); `paraphrastic-embed --engine ray` on them (a local Ray on this machine's cores,
Parquet parts written) and `paraphrastic-embed --threads CORES` on their concatenation (one .npy), each timed as
a whole command, start-up included, --repeats times in turn; the median ratio of their throughputs (this machine is
noisy: one pair alone can be off by a third); and the Ray driver's peak RSS (VmHWM of the
command's own process: the vectors never pass through it); and how busy the machine's cores were over each
command (from /proc/stat): near 100% means the gap is work done, not time spent waiting; and where the Ray
command's CPU seconds go (its actors, its driver, Ray's own processes) beside the local command's.

    python benchmarks/bench_ray.py --item

Where one actor's work item goes, in this process, without Ray: an item of the repeated sample read, embedded,
and written as Parquet parts (ray_engine.Parts.work), each phase timed, the writing split into Parquet and the
part's checksum, beside the same rows by pyarrow's writer, in its other layouts (the vectors as variable-length
lists, as one column a value, as opaque binary) and saved as a .npy (what the local command's output costs
instead), median of --repeats.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, english_sentences, machine_header

BIN = Path(sys.executable).parent


def cpu_ticks() -> tuple[int, int]:
    """(all, idle) clock ticks of the machine's cores since boot; (0, 0) where /proc/stat is not there."""
    try:
        ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0, 0
    return sum(ticks), ticks[3] + ticks[4]  # idle and iowait


def bundled_psutil():
    """psutil as Ray bundles it (ray/thirdparty_files, which importing ray puts on sys.path; Ray 2.60 installs no
    psutil of its own)."""
    import ray  # noqa: F401 - first: it puts its bundled psutil on sys.path

    # isort: split
    import psutil

    return psutil


def process_kind(proc, command: int) -> str:
    """What a process of a timed command's tree is: the command itself, a Ray actor (a worker process), or another
    of its descendants (Ray's own processes: raylet, GCS, agents, monitors; or the local command's workers)."""
    psutil = bundled_psutil()

    if proc.pid == command:
        return "command"
    try:
        actor = proc.name().startswith("ray::") or "default_worker" in " ".join(proc.cmdline())
    except psutil.Error:  # gone meanwhile
        return "other"
    return "actors" if actor else "other"


def sample_tree(command: int, seen: dict) -> None:
    """Note the CPU seconds so far of the command and each of its descendants, by (pid, start time): a process
    that ends between two samples keeps its last ones."""
    psutil = bundled_psutil()

    try:
        root = psutil.Process(command)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for proc in tree:
        try:
            key, spent = (proc.pid, proc.create_time()), sum(proc.cpu_times()[:2])
            seen.setdefault(key, [process_kind(proc, command), 0.0])[1] = spent
        except psutil.Error:
            pass


def timed(cmd: list[str]) -> tuple[float, int, float, dict[str, float]]:
    """(wall seconds, peak RSS in KiB of the command's own process, the share of the cores' time spent busy while
    it ran, and the CPU seconds of its process tree by kind, sampled every half second) of a command that must
    succeed."""
    ticks = cpu_ticks()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, seen, k = 0, {}, 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = max(peak, next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")))
        except (OSError, StopIteration):
            pass
        if k % 5 == 0:
            sample_tree(proc.pid, seen)
        k += 1
        time.sleep(0.1)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.read()[-3000:]}")
    wall, (total, idle) = time.perf_counter() - start, [b - a for a, b in zip(ticks, cpu_ticks(), strict=True)]
    spent = collections.Counter()
    for kind, seconds in seen.values():
        spent[kind] += seconds
    return wall, peak, 1 - idle / total if total > 0 else float("nan"), dict(spent)


def write_files(folder: Path, lines: int, files: int) -> Path:
    """`files` files of the repeated sample (odd ones gzip) and their concatenation; returns the latter."""
    sample = english_sentences()
    every = [sample[i % len(sample)] for i in range(lines)]
    per = -(-lines // files)
    with open(folder / "all.txt", "w", encoding="utf-8") as whole:
        for i in range(files):
            text = "".join(s + "\n" for s in every[i * per : (i + 1) * per])
            whole.write(text)
            path = folder / "in" / (f"part-{i:02d}.txt.gz" if i % 2 else f"part-{i:02d}.txt")
            path.write_bytes(gzip.compress(text.encode(), 1) if i % 2 else text.encode())
    return folder / "all.txt"


def other_writes(table, folder: Path) -> dict[str, float]:
    """Seconds of what a part's writing is made of, on one part's table: Parquet without the checksum, its sha256
    alone; the same table by pyarrow's writer (what write_part used before polars'); and the other layouts the
    vectors could take, by pyarrow: a variable-length list, one float column per value, and opaque fixed-size
    binary values (the same bytes without the list's levels, which DuckDB and polars would then read as blobs)."""
    import hashlib

    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paraphrastic.ray_engine import PART_OPTIONS

    options = {"compression": "none", "use_dictionary": ["file"], "write_statistics": ["file", "line"]}
    vectors = table.column("vector").combine_chunks()
    width = vectors.type.list_size * vectors.type.value_type.bit_width // 8
    blobs = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(vectors), [None, vectors.values.buffers()[1]])
    took = {}
    clock = time.perf_counter()
    pl.from_arrow(table).write_parquet(folder / "plain.parquet", **PART_OPTIONS)
    took["  of which Parquet alone"] = time.perf_counter() - clock
    data = (folder / "plain.parquet").read_bytes()
    clock = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    took["  of which its sha256"] = time.perf_counter() - clock
    floats = vectors.values.to_numpy().reshape(len(vectors), -1)
    offsets = pa.array(np.arange(0, floats.size + 1, floats.shape[1], dtype=np.int32))
    keys = table.drop_columns("vector")
    columns = [pa.array(floats[:, k]) for k in range(floats.shape[1])]
    layouts = {
        "pyarrow, the same table": table,
        "pyarrow, vectors as lists": table.set_column(2, "vector", pa.ListArray.from_arrays(offsets, vectors.values)),
        "pyarrow, a column a value": pa.Table.from_arrays(
            [*keys.columns, *columns], names=[*keys.column_names, *(f"d{k}" for k in range(len(columns)))]
        ),
        "pyarrow, vectors as blobs": table.set_column(2, "vector", blobs),
    }
    for name, layout in layouts.items():
        clock = time.perf_counter()
        pq.write_table(layout, pa.OSFile(str(folder / "other.parquet"), "wb"), **options)
        took[name] = time.perf_counter() - clock
    return took


def time_item(repeats: int) -> None:
    """Print the median seconds of each step of one work item of LINES_PER_ITEM lines as an actor runs it
    (ray_engine.Parts.work: read, embed, write each Parquet part), what the writing is made of (other_writes), and
    np.save of the same rows."""
    import numpy as np

    from paraphrastic import ray_engine
    from paraphrastic.static import TORCH_FROM

    sample = english_sentences()
    spent: dict[str, list[float]] = {"read": [], "embed": [], "write Parquet": [], "  of which Parquet alone": [],
                                     "  of which its sha256": [], "pyarrow, the same table": [],
                                     "pyarrow, vectors as lists": [], "pyarrow, a column a value": [],
                                     "pyarrow, vectors as blobs": [], ".npy of the same rows": []}  # fmt: skip
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
        path = Path(tmp) / "item.txt"
        path.write_text("".join(sample[i % len(sample)] + "\n" for i in range(ray_engine.LINES_PER_ITEM)))
        item = ray_engine.plan([path])[0]
        parts = ray_engine.Parts(None, tmp, share=TORCH_FROM)  # pooled by torch, as in a long run
        for k in range(repeats + 1):  # the first warms the model and the page cache
            took = dict.fromkeys(spent, 0.0)
            clock = time.perf_counter()
            for n, (first, lines, _) in enumerate(ray_engine.read_items(item, "text", strict=False)):
                took["read"] += time.perf_counter() - clock
                clock = time.perf_counter()
                table = parts.vectors(item["file"], first, lines)
                took["embed"] += time.perf_counter() - clock
                clock = time.perf_counter()
                ray_engine.write_part(Path(tmp) / f"part-{n}.parquet", table)
                took["write Parquet"] += time.perf_counter() - clock
                for name, seconds in other_writes(table, Path(tmp)).items():
                    took[name] += seconds
                rows = table.column("vector").combine_chunks().values.to_numpy().reshape(len(lines), -1)
                clock = time.perf_counter()
                np.save(Path(tmp) / f"part-{n}.npy", rows)
                took[".npy of the same rows"] += time.perf_counter() - clock
                clock = time.perf_counter()
            for name in spent if k else ():
                spent[name].append(took[name])
    print(f"{machine_header()}\none work item of {ray_engine.LINES_PER_ITEM:,} lines as an actor runs it, in this "
          f"process, median of {repeats}:")  # fmt: skip
    for name, times in spent.items():
        print(f"  {name:26s} {statistics.median(times):6.3f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="200000,2000000", help="lines, comma-separated")
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="ray/local pairs timed in turn; the medians are printed")
    p.add_argument("--item", action="store_true", help="time the steps of one actor's work item instead")
    args = p.parse_args()
    if args.item:
        time_item(args.repeats)
        return
    cores = len(os.sched_getaffinity(0))
    print(f"{machine_header()}; a local Ray with {cores} CPUs against --threads {cores}; median of {args.repeats} "
          "pairs run in turn (ray / local: the median of the pairs' ratios, then their range)")  # fmt: skip
    print("| lines | ray (sent/s) | paraphrastic-embed (sent/s) | ray / local | range | ray driver peak RSS "
          "| cores busy (ray / local) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    notes = []
    for size in map(int, args.sizes.split(",")):
        with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:
            folder = Path(tmp)
            (folder / "in").mkdir()
            whole = write_files(folder, size, args.files)
            rays, locals_, drivers, busy, spent = [], [], [], [], []
            embed = str(BIN / "paraphrastic-embed")
            for k in range(args.repeats):
                ray_s, driver, ray_busy, ray_cpu = timed([embed, "--engine", "ray", "--input",
                                                          str(folder / "in" / "*"), "--output-dir",
                                                          str(folder / f"out{k}"), "--quiet"])  # fmt: skip
                shutil.rmtree(folder / f"out{k}")  # one output on disk at a time (20,000,000 lines: 20 GB each)
                local_s, _, local_busy, local_cpu = timed([embed, "--sentence-file", str(whole), "--output-file",
                                                           str(folder / "all.npy"), "--threads", str(cores),
                                                           "--quiet"])  # fmt: skip
                (folder / "all.npy").unlink()
                rays, locals_, drivers = rays + [ray_s], locals_ + [local_s], drivers + [driver]
                busy.append((ray_busy, local_busy))
                spent.append((ray_cpu, local_cpu))
            ratios = sorted(local / ray for ray, local in zip(rays, locals_, strict=True))
            print(f"| {size:,} | {size / statistics.median(rays):,.0f} | {size / statistics.median(locals_):,.0f} | "
                  f"{statistics.median(ratios):.0%} | {ratios[0]:.0%}-{ratios[-1]:.0%} | "
                  f"{max(drivers) / 1024:,.0f} MiB | {statistics.median(b[0] for b in busy):.0%} / "
                  f"{statistics.median(b[1] for b in busy):.0%} |", flush=True)  # fmt: skip
            notes += [f"{size:,} lines, pair {k + 1}: ray {sum(ray.values()):.0f} core-s (actors "
                      f"{ray.get('actors', 0):.0f}, driver {ray.get('command', 0):.0f}, Ray's own processes "
                      f"{ray.get('other', 0):.0f}), local {sum(local.values()):.0f}"
                      for k, (ray, local) in enumerate(spent)]  # fmt: skip
    print("CPU seconds of each command's processes (sampled every 0.5 s):", *notes, sep="\n  ")


if __name__ == "__main__":
    main()
