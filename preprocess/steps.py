"""Streaming preprocessing steps: filter -> dedup -> shuffle -> sentencepiece -> HDF5 shards.

Each step reads files, writes one output atomically, records its kept/dropped counts in a
`stats.json`, and is skipped when its output already exists (unless --force). Memory is bounded
by chunk and bucket sizes, never by the corpus: 50M-line inputs stream through. Run as
`python -m paraphrastic.preprocess.steps STEP ...` from the repository root (the do_all.sh scripts do).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import itertools
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from paraphrastic.cli import at_least, run_cli
from paraphrastic.fileio import (
    InputError,
    atomic_output,
    count_lines,
    iter_line_chunks,
    open_binary,
    scratch_folder,
    split_pair,
)
from paraphrastic.pieces import Tokenizer, flatten, train_sentencepiece
from paraphrastic.preprocess.filters import filter_pairs, ngram_overlap, tokenize
from paraphrastic.shards import write_shard

CHUNK_LINES = 50_000
# ISO 639-1 codes to the other names the same language has in our TSV collections (NTREX, Tatoeba-Challenge).
ALIASES = {
    "ar": ["ara", "arb"],
    "de": ["deu"],
    "es": ["spa", "spa-MX"],
    "fr": ["fra", "fra-CA"],
    "ru": ["rus"],
    "tr": ["tur"],
    "zh": ["zho", "zho-CN", "zho-TW", "cmn"],
}

# ---------------------------------------------------------------------------------------------
# filters (pure functions: the unit tests call them directly)


def trigram_overlap(a: str, b: str) -> float:
    """ParaNMT's filter: the share of the shorter side's word trigrams that also occur in the other side."""
    return ngram_overlap(tokenize(a), tokenize(b), 3)


def length_ok(sentence: str, low: int, high: int) -> bool:
    """Whitespace token count (untokenized) within [low, high]."""
    return low <= len(sentence.split()) <= high


def normalize(sentence: str) -> str:
    """Lowercase and collapse whitespace (tabs and newlines included) to single spaces."""
    return " ".join(sentence.lower().split())


def segment_chinese(sentences: list[str]) -> list[str]:
    """Split Chinese into words with jieba so sentencepiece sees word boundaries (as the paper did)."""
    try:
        import jieba
    except ImportError:
        raise InputError("Chinese needs the jieba package: pip install jieba") from None
    jieba.setLogLevel(60)
    return [" ".join(w for w in jieba.cut(s) if not w.isspace()) for s in sentences]


def load_lid(path: str | os.PathLike):
    """The fastText language-ID model (lid.176.bin or any supervised model with __label__xx labels)."""
    try:
        import fasttext
    except ImportError:
        raise InputError("language ID needs the fasttext package: pip install fasttext") from None
    if not Path(path).is_file():
        raise InputError(f"{path}: no such fastText language-ID model (set LID_MODEL or let do_all.sh download it)")
    fasttext.FastText.eprint = lambda *args, **kwargs: None  # silence its load-time warning
    return fasttext.load_model(str(path))


def detect_languages(model, sentences: list[str]) -> list[str]:
    """Top language code of each sentence, predicted in one batched C++ call."""
    labels, _ = model.predict(sentences, k=1)
    return [label[0].removeprefix("__label__") if label else "" for label in labels]


# ---------------------------------------------------------------------------------------------
# chunk workers (run in a process pool; module-level state holds the per-process models)

_WORKER: dict = {}


def _init_worker(config: dict) -> None:
    _WORKER.clear()
    _WORKER.update(config)
    if config.get("lid_model"):
        _WORKER["lid"] = load_lid(config["lid_model"])


def filter_paranmt_chunk(lines: list[bytes]) -> tuple[bytes, Counter]:
    """Filter ParaNMT lines `sent1<TAB>sent2<TAB>score`: length, score, trigram overlap, then language.

    A dropped pair is counted under the first filter it fails.
    """
    c, stats, kept = _WORKER, Counter(read=len(lines)), []
    for raw in lines:
        parts = raw.decode("utf-8", errors="replace").rstrip("\r\n").split("\t")
        try:
            a, b, score = parts[0], parts[1], float(parts[2])
        except (IndexError, ValueError):
            stats["malformed"] += 1
            continue
        if not (length_ok(a, c["min_len"], c["max_len"]) and length_ok(b, c["min_len"], c["max_len"])):
            stats["length"] += 1
        elif not c["sim_low"] <= score <= c["sim_high"]:
            stats["similarity"] += 1
        elif trigram_overlap(a, b) > c["ovl"]:
            stats["overlap"] += 1
        else:
            kept.append((normalize(a), normalize(b)))
    if "lid" in _WORKER and kept:
        langs = detect_languages(_WORKER["lid"], [s for pair in kept for s in pair])
        english = [langs[2 * i] == "en" and langs[2 * i + 1] == "en" for i in range(len(kept))]
        stats["language"] += len(kept) - sum(english)
        kept = list(itertools.compress(kept, english))
    stats["kept"] += len(kept)
    return "".join(f"{a}\t{b}\n" for a, b in kept).encode(), stats


def filter_bitext_chunk(pairs: list[tuple[str, str]]) -> tuple[bytes, Counter]:
    """Filter (English, other) pairs: English length in range and a non-empty other side; lowercase."""
    c, stats, kept = _WORKER, Counter(read=len(pairs)), []
    for en, xx in pairs:
        en, xx = normalize(en), normalize(xx)
        if not xx:
            stats["empty"] += 1
        elif not length_ok(en, c["min_len"], c["max_len"]):
            stats["length"] += 1
        else:
            kept.append((en, xx))
    if c["lang"] == "zh" and kept:
        kept = list(zip([p[0] for p in kept], segment_chinese([p[1] for p in kept]), strict=True))
    stats["kept"] += len(kept)
    return "".join(f"{en}\t{xx}\n" for en, xx in kept).encode(), stats


def _run_chunks(worker, chunks: Iterator, config: dict, out: Path, workers: int, total: int, desc: str) -> Counter:
    """Map `worker` over chunks (in a pool when workers > 1) and write the kept lines in input order.

    At most 2 x workers chunks are in flight, so memory stays bounded whatever the input size.
    """
    stats = Counter()
    with atomic_output(out) as f, tqdm(total=total, unit="B", unit_scale=True, desc=desc, mininterval=2) as bar:
        for blob, s in _map_bounded(worker, chunks, config, workers, bar):
            f.write(blob)
            stats.update(s)
    return stats


def _map_bounded(worker, chunks: Iterator, config: dict, workers: int, bar: tqdm) -> Iterator:
    if workers <= 1:
        _init_worker(config)
        for chunk, nbytes in chunks:
            yield worker(chunk)
            bar.update(nbytes)
        return
    with multiprocessing.get_context("fork").Pool(workers, _init_worker, (config,)) as pool:
        in_flight = collections.deque()
        for chunk, nbytes in chunks:
            in_flight.append((pool.apply_async(worker, (chunk,)), nbytes))
            if len(in_flight) >= 2 * workers:
                yield _collect(in_flight.popleft(), bar)
        while in_flight:
            yield _collect(in_flight.popleft(), bar)


def _collect(job: tuple, bar: tqdm):
    result, nbytes = job
    bar.update(nbytes)
    return result.get()


# ---------------------------------------------------------------------------------------------
# readers


def _maybe_gzip(raw, path: Path):
    return gzip.open(raw) if path.suffix == ".gz" else raw


def read_line_chunks(path: Path, chunk_lines: int = CHUNK_LINES) -> Iterator[tuple[list[bytes], int]]:
    """(raw lines, on-disk bytes consumed) chunks of a plain or .gz file."""
    with open(path, "rb") as raw, _maybe_gzip(raw, path) as f, damaged_gzip_is_input_error(path):
        done = 0
        while lines := list(itertools.islice(f, chunk_lines)):
            pos = raw.tell()
            yield lines, pos - done
            done = pos


@contextlib.contextmanager
def damaged_gzip_is_input_error(path: str | Path) -> Iterator[None]:
    """A truncated or corrupt .gz file read in the block becomes an InputError naming it."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise InputError(f"{path}: truncated or corrupt gzip file ({e or type(e).__name__}); fetch it again") from None


def read_bitext_chunks(source: tuple[Path, ...], chunk_lines: int = CHUNK_LINES) -> Iterator[tuple[list, int]]:
    """(English, other) pair chunks of one source: a `en<TAB>xx` TSV (.gz) or a Moses pair of files."""
    if len(source) == 1:
        for lines, nbytes in read_line_chunks(source[0], chunk_lines):
            text = [line.decode("utf-8", errors="replace").rstrip("\r\n").split("\t") for line in lines]
            yield [(p[0], p[1]) if len(p) == 2 else ("", "") for p in text], nbytes
        return
    en_path, xx_path = source
    with (
        open(en_path, "rb") as raw,
        _maybe_gzip(raw, en_path) as fe,
        open_binary(xx_path) as fx,
        damaged_gzip_is_input_error(" or ".join(str(p) for p in source if p.suffix == ".gz")),
    ):
        done = 0
        for en, xx in _zip_chunks(fe, fx, chunk_lines):
            yield list(zip(_decode(en), _decode(xx), strict=True)), raw.tell() - done
            done = raw.tell()


def _zip_chunks(fe, fx, chunk_lines: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    while True:
        en, xx = list(itertools.islice(fe, chunk_lines)), list(itertools.islice(fx, chunk_lines))
        if len(en) != len(xx):
            raise InputError(f"{fe.name} and {fx.name}: the two sides of a Moses pair differ in line count")
        if not en:
            return
        yield en, xx


def _decode(lines: list[bytes]) -> list[str]:
    return b"".join(lines).decode("utf-8", errors="replace").splitlines()


def find_bitext(root: Path, lang: str, exclude: tuple[str, ...] = ("tatoeba",)) -> list[tuple[Path, ...]]:
    """Every source of English-`lang` pairs under `root`: `en-<code>[.*].tsv[.gz]` files and Moses pairs
    `<corpus>.<l1>-<l2>.{en,<code>}` (OPUS layout). Folders or files whose name starts with an `exclude`
    prefix are skipped (Tatoeba is the mining test domain)."""
    codes = [lang, *ALIASES.get(lang, [])]
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or any(p.lower().startswith(exclude) for p in path.relative_to(root).parts):
            continue
        name = path.name.removesuffix(".gz")
        if name.endswith(".tsv") and name.split(".")[0] in {f"en-{c}" for c in codes}:
            found.append((path,))
        elif _moses_pair_of(name, codes):
            xx = path.with_name(path.name.removesuffix(".gz")[: -len(".en")] + f".{lang}")
            xx = next((p for p in (xx, xx.with_name(xx.name + ".gz")) if p.is_file()), None)
            if xx is None:
                raise InputError(f"{path}: the Moses English side has no {lang} side beside it")
            found.append((path, xx))
    return found


def _moses_pair_of(name: str, codes: list[str]) -> bool:
    parts = name.split(".")
    pairs = {f"en-{c}" for c in codes} | {f"{c}-en" for c in codes}
    return len(parts) >= 3 and parts[-1] == "en" and parts[-2] in pairs


# ---------------------------------------------------------------------------------------------
# steps


def filter_paranmt(
    src: Path,
    out: Path,
    lid_model: Path | None,
    sim_low: float,
    sim_high: float,
    ovl: float,
    min_len: int = 5,
    max_len: int = 40,
    workers: int | None = None,
) -> dict:
    """ParaNMT -> lowercased `sent1<TAB>sent2` pairs that pass length, score, overlap and English LID."""
    if not src.is_file():
        raise InputError(f"{src}: no such ParaNMT file")
    config = dict(sim_low=sim_low, sim_high=sim_high, ovl=ovl, min_len=min_len, max_len=max_len)
    config["lid_model"] = str(lid_model) if lid_model else None
    if lid_model:
        load_lid(lid_model)  # fail before the pool starts
    workers = workers or os.cpu_count() or 1
    chunks = read_line_chunks(src)
    stats = _run_chunks(filter_paranmt_chunk, chunks, config, out, workers, src.stat().st_size, "filter")
    return {k: stats[k] for k in ("read", "malformed", "length", "similarity", "overlap", "language", "kept")}


def filter_bitext(
    root: Path, lang: str, out: Path, min_len: int = 3, max_len: int = 100, workers: int | None = None
) -> dict:
    """All English-`lang` sources under `root` -> lowercased `en<TAB>xx` pairs with English length in range."""
    sources = find_bitext(root, lang)
    if not sources:
        raise InputError(f"{root}: no en-{lang} bitext found (expected en-{lang}*.tsv.gz or OPUS Moses files)")
    chunks = itertools.chain.from_iterable(read_bitext_chunks(s) for s in sources)
    total = sum(s[0].stat().st_size for s in sources)
    config = dict(lang=lang, min_len=min_len, max_len=max_len)
    stats = _run_chunks(filter_bitext_chunk, chunks, config, out, workers or os.cpu_count() or 1, total, f"en-{lang}")
    result = {k: stats[k] for k in ("read", "empty", "length", "kept")}
    result["sources"] = [str(p) for s in sources for p in s]
    return result


def dedup(inputs: list[Path], out: Path, memory: str = "1G", threads: int | None = None) -> dict:
    """Keep exactly one copy of each distinct line: external `sort -u` (bytewise), memory bounded by `memory`."""
    read = sum(count_lines(p) for p in inputs)
    with atomic_output(out) as f:
        cmd = ["sort", "-u", "-S", memory, f"--parallel={threads or os.cpu_count() or 1}", "-T", str(out.parent)]
        done = subprocess.run(
            [*cmd, *map(str, inputs)], stdout=f, stderr=subprocess.PIPE, env={**os.environ, "LC_ALL": "C"}
        )
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            raise InputError(f"{out}: sort failed ({why[0]}); {out} was left as it was")
    kept = count_lines(out)
    return {"read": read, "duplicates": read - kept, "kept": kept}


def shuffle(src: Path, out: Path, seed: int = 0, bucket_bytes: int = 128 << 20) -> dict:
    """Uniform shuffle in bounded memory: deal lines into random buckets on disk, then permute each bucket."""
    rng = np.random.default_rng(seed)
    k = max(1, math.ceil(src.stat().st_size / bucket_bytes))
    with scratch_folder(out.parent, ".shuffle") as tmp:
        buckets = [tmp / f"{i}" for i in range(k)]
        files = [open(b, "wb") for b in buckets]
        with open(src, "rb") as f, tqdm(total=src.stat().st_size, unit="B", unit_scale=True, desc="shuffle") as bar:
            while lines := f.readlines(32 << 20):
                bar.update(sum(map(len, lines)))
                ids = rng.integers(k, size=len(lines))
                order = np.argsort(ids, kind="stable")
                parts = np.split(_as_objects(lines)[order], np.cumsum(np.bincount(ids, minlength=k))[:-1])
                for fh, part in zip(files, parts, strict=True):
                    fh.write(b"".join(part))
        for fh in files:
            fh.close()
        n = 0
        with atomic_output(out) as f:
            for b in buckets:
                lines = _as_objects(b.read_bytes().splitlines(keepends=True))
                f.write(b"".join(lines[rng.permutation(len(lines))]))
                n += len(lines)
                b.unlink()
    return {"lines": n, "buckets": k}


def _as_objects(lines: list[bytes]) -> np.ndarray:
    arr = np.empty(len(lines), dtype=object)
    arr[:] = lines
    return arr


def train_sp(src: Path, out: Path, vocab_size: int, sample_pairs: int = 1_000_000, threads: int | None = None) -> dict:
    """One sentencepiece model over both sides of the first `sample_pairs` pairs of the shuffled file."""

    with scratch_folder(out.parent, ".sp-text") as tmp, open(tmp / "text.txt", "wb") as text, open(src, "rb") as f:
        for lines in iter(lambda: list(itertools.islice(f, 100_000)), []):
            text.write(b"".join(lines).replace(b"\t", b"\n"))
            sample_pairs -= len(lines)
            if sample_pairs <= 0:
                break
        text.flush()
        if text.tell() == 0:
            raise InputError(f"{src}: no text to train the sentencepiece model on (the file is empty)")
        model = train_sentencepiece(text.name, vocab_size, threads)
    with atomic_output(out) as f:
        f.write(model)
    return {"vocab_size_asked": vocab_size, "pieces": len(Tokenizer(model, lowercase=True))}


def encode_shards(
    src: Path,
    sp_model: Path,
    out_dir: Path,
    shard_pairs: int = 1_000_000,
    chunk_pairs: int = 100_000,
    threads: int | None = None,
) -> dict:
    """Encode `a<TAB>b` pairs with sentencepiece (all cores) into HDF5 shards of `shard_pairs` pairs each.

    Shards are written into a temporary folder that is renamed to `out_dir` when all are done.
    """
    sp_bytes = sp_model.read_bytes()
    tokenizer = Tokenizer(sp_bytes, lowercase=True)
    threads = threads or os.cpu_count() or 1
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pending: list[tuple] = []
    stats = Counter()

    def flush(final: bool) -> None:
        nonlocal pending
        src_ids, tgt_ids = _concat([p[0] for p in pending]), _concat([p[1] for p in pending])
        while len(src_ids[1]) >= shard_pairs or (final and len(src_ids[1])):
            (head_s, src_ids), (head_t, tgt_ids) = _cut(src_ids, shard_pairs), _cut(tgt_ids, shard_pairs)
            write_shard(tmp / f"shard-{stats['shards']:05d}.h5", head_s, head_t, sp_bytes, lowercase=True)
            stats["shards"] += 1
        pending = [(src_ids, tgt_ids)]

    with tqdm(total=count_lines(src), unit=" pairs", unit_scale=True, desc="encode", mininterval=2) as bar:
        for lines in iter_line_chunks(src, min(chunk_pairs, shard_pairs)):
            left, right = zip(
                *(split_pair(line, src, stats["pairs"] + k + 1) for k, line in enumerate(lines)), strict=True
            )
            pending.append((flatten(tokenizer.encode(left, threads)), flatten(tokenizer.encode(right, threads))))
            stats["pairs"] += len(lines)
            bar.update(len(lines))
            if sum(len(p[0][1]) for p in pending) >= shard_pairs:
                flush(final=False)
    if pending:
        flush(final=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return dict(stats)


def _concat(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _cut(side: tuple[np.ndarray, np.ndarray], n: int) -> tuple[tuple, tuple]:
    """Split (flat ids, lengths) into the first n sentences and the rest."""
    flat, lengths = side
    split = int(lengths[:n].sum())
    return (flat[:split], lengths[:n]), (flat[split:], lengths[n:])


def record_stats(path: Path, step: str, stats: dict) -> None:
    """Merge one step's counts into the run's stats.json (atomically) and print them."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[step] = stats
    with atomic_output(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    shown = {k: v for k, v in stats.items() if k != "sources"}
    print(f"[{step}] " + " ".join(f"{k}={v}" for k, v in shown.items()), file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m paraphrastic.preprocess.steps", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="step", required=True)

    def step(name: str, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help)
        s.add_argument("--out", type=Path, required=True, help="output file (a folder for encode)")
        s.add_argument("--stats", type=Path, help="stats.json to record the counts in")
        s.add_argument("--force", action="store_true", help="redo the step even if its output exists")
        return s

    s = step("filter-paranmt", "ParaNMT -> filtered, lowercased pairs")
    s.add_argument("input", type=Path)
    s.add_argument("--lid-model", type=Path, help="fastText language-ID model (lid.176.bin); omit to skip LID")
    s.add_argument("--sim-low", type=at_least(-1.0, float), required=True, help="least cosine of the pair")
    s.add_argument("--sim-high", type=at_least(-1.0, float), required=True, help="largest cosine of the pair")
    s.add_argument("--ovl", type=at_least(0.0, float), required=True, help="maximum trigram overlap")
    s.add_argument("--min-len", type=at_least(0), default=5)
    s.add_argument("--max-len", type=at_least(1), default=40)
    s.add_argument("--workers", type=at_least(1))
    s = step("filter-bitext", "all en-LANG bitext under a folder -> filtered, lowercased pairs")
    s.add_argument("root", type=Path)
    s.add_argument("--lang", required=True)
    s.add_argument("--min-len", type=at_least(0), default=3)
    s.add_argument("--max-len", type=at_least(1), default=100)
    s.add_argument("--workers", type=at_least(1))
    s = step("dedup", "keep one copy of each pair")
    s.add_argument("inputs", type=Path, nargs="+")
    s.add_argument("--memory", default="1G", help="sort buffer size (bounds memory)")
    s = step("shuffle", "bounded-memory shuffle")
    s.add_argument("input", type=Path)
    s.add_argument("--seed", type=int, default=0)
    s = step("train-sp", "train the sentencepiece model")
    s.add_argument("input", type=Path)
    s.add_argument("--vocab-size", type=at_least(8), default=50_000)
    s.add_argument("--sample-pairs", type=at_least(1), default=1_000_000)
    s = step("filter-pairs", "paraphrase pairs -> those that pass length, overlap, BLEU and perplexity filters")
    s.add_argument("input", type=Path)
    s.add_argument("--length", type=at_least(0), nargs=2, default=[0, 10], metavar=("LO", "HI"),
                   help="tokens of the second side (default 0 10: the paper's best)")  # fmt: skip
    s.add_argument("--overlap", type=at_least(1), nargs="*", default=[], metavar="N",
                   help="filter by the n-gram overlap of the two sides for these n (e.g. 1 2 3)")  # fmt: skip
    s.add_argument("--overlap-range", type=at_least(0.0, float), nargs=2, default=[0.0, 0.7], metavar=("LO", "HI"),
                   help="allowed overlap (default 0 0.7: the paper found upper bounds of 0.6-0.7 best)")  # fmt: skip
    s.add_argument(
        "--bleu", type=at_least(0.0, float), nargs=2, metavar=("LO", "HI"), help="allowed sentence BLEU (smoothed)"
    )
    s.add_argument("--lm-text", type=Path, help="reference text (a sentence per line) for the trigram model")
    s.add_argument(
        "--max-perplexity", type=at_least(1.0, float), help="with --lm-text: the second side's perplexity bound"
    )
    s = step("encode", "encode pairs into HDF5 shards")
    s.add_argument("input", type=Path)
    s.add_argument("--sp-model", type=Path, required=True)
    s.add_argument("--shard-pairs", type=at_least(1), default=1_000_000)
    args = p.parse_args(argv)
    bounds = [("--sim-low/--sim-high", getattr(args, "sim_low", None), getattr(args, "sim_high", None)),
              ("--min-len/--max-len", getattr(args, "min_len", None), getattr(args, "max_len", None))]  # fmt: skip
    for name in ("length", "overlap_range", "bleu"):
        bounds.append((f"--{name.replace('_', '-')}", *(getattr(args, name, None) or (None, None))))
    for given, low, high in bounds:  # a range upside down keeps nothing, and the step would say it was done
        if low is not None and low > high:
            p.error(f"{given}: {low} is above {high}, so nothing would pass")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"[{args.step}] {args.out} exists: skipped (FORCE=1 / --force redoes it)", file=sys.stderr)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.step == "filter-paranmt":
        stats = filter_paranmt(
            args.input, args.out, args.lid_model, args.sim_low, args.sim_high, args.ovl, args.min_len, args.max_len,
            args.workers,
        )  # fmt: skip
    elif args.step == "filter-bitext":
        stats = filter_bitext(args.root, args.lang, args.out, args.min_len, args.max_len, args.workers)
    elif args.step == "dedup":
        stats = dedup(args.inputs, args.out, args.memory)
    elif args.step == "shuffle":
        stats = shuffle(args.input, args.out, args.seed)
    elif args.step == "filter-pairs":
        if (args.lm_text is None) != (args.max_perplexity is None):
            raise InputError("--lm-text and --max-perplexity go together")
        overlaps = [(n, *args.overlap_range) for n in args.overlap]
        stats = filter_pairs(
            args.input, args.out, tuple(args.length), overlaps, args.bleu, args.lm_text, args.max_perplexity
        )
    elif args.step == "train-sp":
        stats = train_sp(args.input, args.out, args.vocab_size, args.sample_pairs)
    else:
        stats = encode_shards(args.input, args.sp_model, args.out, args.shard_pairs)
    name = f"{args.step}-{args.lang}" if args.step == "filter-bitext" else args.step
    if args.stats:
        record_stats(args.stats, name, stats)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main)())
