"""Every console command's options and help, with the constants they name: light on purpose (argparse and
cli.py, no numpy), so that commands.py reads a command's options, and answers --help or a mistaken option, before
any module a run needs is imported. The commands' modules take their `parse_args` from here."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from paraphrastic.cli import at_least, cli_parser, device_name, refuse_unused

STORED_PRECISIONS = ("float32", "float16", "int8")  # how a model file may store its table
DTYPES = ("float32", "float16", "binary", "ubinary")  # embed's rows; binary, ubinary: each row's signs, 8 a byte
DEFAULT_THRESHOLD = {"margin": 1.06, "cosine": 0.7}  # mine's, by criterion
TASKS = ("sts", "sts17", "stsb", "sick", "tatoeba", "pud", "flores")  # evaluate's
DEFAULT_LANGS = ["ara", "deu", "spa", "fra", "rus", "tur", "cmn"]  # evaluate's Tatoeba languages
EXAMPLE_CORPUS = Path(__file__).resolve().parent / "data" / "example-sentences.txt"  # the demo's search corpus
MAX_CORPUS_LINES = 2_000_000  # the demo's largest corpus

EMBED = """Embed a file of sentences (one per line) into an .npy matrix, one row per line, in order."""

SCORE = """Score sentence pairs (`sentence1<TAB>sentence2` per line) by the cosine of their embeddings."""

MINE = """Mine translation pairs from two text files, or paraphrase pairs from one, by margin-scored kNN search.

    paraphrastic-mine --source de.txt --target en.txt --load-file model.pt --output-file mined.tsv
    paraphrastic-mine --paraphrase en.txt --output-file paraphrases.tsv

Each file is embedded into a float16 (or float32) memory map in chunks; each side is indexed with faiss
(exact inner product below --ivf-min sentences, an IVF index from there; without faiss, small inputs are
searched exactly with torch) and searched in chunks for every sentence's k nearest neighbours on the other
side. Memory: the vectors stay on disk; one index (4 x dim bytes per sentence) and k neighbours per sentence
are held at a time. A candidate pair is scored with the ratio margin of
Artetxe and Schwenk (2019), the cosine divided by the mean cosine of both sentences' neighbourhoods,
    score(x, y) = cos(x, y) / (sum_{z in NN_k(x)} cos(x, z) / 2k + sum_{z in NN_k(y)} cos(y, z) / 2k),
or by the plain cosine (--criterion cosine). Retrieval (--retrieval): max-score (default, the paper's):
the best-scoring candidate of every source and of every target are pooled and taken in decreasing score,
each sentence used at most once; forward: every source's best target; intersect: pairs that are each
other's best. Blank lines are never mined. With --paraphrase, one file is mined against itself: each
sentence's best neighbour other than itself (forward retrieval by default), exact duplicate lines
counted once, every unordered pair written once. Pairs scoring at least --threshold are written as
score<TAB>source<TAB>target, best first, atomically (tabs inside a sentence become spaces). The default
thresholds are conventional starting points, not tuned for any model: choose one on held-out pairs
(scripts/mine_tatoeba.sh shows how), or write every retrieved pair with --threshold=-inf.
"""

EVALUATE = """Evaluate a model on STS 2012-2016, STS 2017, STS Benchmark, SICK-R and Tatoeba, as in the paper, and on
PUD and FLORES retrieval."""

EXPORT = """Our SP models as Hugging Face static-embedding folders (sentence-transformers, model2vec), and back."""

DEMO = """A local demo web page: how similar two sentences are, search in a corpus, and translation matching."""


def default_data_dir() -> Path:
    """Where the evaluation data is looked for: $PARAPHRASTIC_DATA, else ../shared/data beside a checkout, else
    ~/.cache/paraphrastic/data, the folder `python -m paraphrastic.preprocess.evaluation.download` fills."""
    if os.environ.get("PARAPHRASTIC_DATA"):
        return Path(os.environ["PARAPHRASTIC_DATA"])
    beside = Path(__file__).resolve().parent.parent / "shared" / "data"
    if beside.is_dir():
        return beside
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paraphrastic" / "data"


def add_ray_args(p: argparse.ArgumentParser, what: str) -> None:
    """--engine and the options of the Ray engine, shared by embed and score."""
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: worker processes on this machine; ray: a Ray cluster (pip install \"paraphrastic[ray]\")")  # fmt: skip
    p.add_argument("--input", nargs="+", metavar="PATTERN", help=f"with --engine ray: files or globs of {what}")
    p.add_argument("--output-dir", help="with --engine ray: a new or empty folder for the Parquet parts and manifest")
    p.add_argument("--address", help="with --engine ray: a running cluster (default: a local Ray on this machine)")
    p.add_argument("--resume", action="store_true",
                   help="with --engine ray: finish the stopped run in --output-dir (same inputs, model, options)")  # fmt: skip


def refuse_local_options(p: argparse.ArgumentParser, args: argparse.Namespace, *dests: str) -> None:
    """With --engine ray: one usage error naming each option of `dests` given, which the engine would not follow."""
    why = "its actors read our model files, on their CPUs, and write Parquet parts to --output-dir"
    refuse_unused(p, args, "--engine ray", why, *dests)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--load-file and --sp-model, as embed, score and mine take them."""
    p.add_argument(
        "--load-file", help="model file, or a shipped model's name: default (English; the default) or multilingual"
    )
    p.add_argument("--sp-model", help="sentencepiece model, only for original-toolkit model files")


def add_work_args(p: argparse.ArgumentParser, unit: str) -> None:
    """How embed and score cut their work (`unit`: what a batch holds) and where they run it."""
    text = f"{unit} per tokenize+pool step (a mean model's: 1,024 at least)"
    p.add_argument("--batch-size", type=at_least(1), default=8192, help=text)
    p.add_argument("--chunk-lines", type=at_least(1), default=16384, help="lines in one worker's job")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:N or auto")


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    """embed's and score's --threads."""
    p.add_argument(
        "--threads",
        type=at_least(1),
        help="worker processes, one core each, no more than the jobs of --chunk-lines lines (default: the idle cores)",
    )


def embed_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(
        EMBED,
        "paraphrastic-embed --sentence-file data/example-sentences.txt --output-file vectors.npy\n"
        "shards: paraphrastic-embed --sentence-file X --output-file part-I.npy --shard I --num-shards N, then\n"
        "  paraphrastic-embed --concat all.npy part-0.npy ... part-(N-1).npy",
    )
    p.add_argument("--sentence-file", help="UTF-8 text, one sentence per line; - reads standard input")
    add_model_args(p)
    p.add_argument("--output-file", help="output .npy, shape (lines, dim)")
    add_work_args(p, "sentences")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="the rows' type; binary / ubinary: each row's signs, 8 a byte, as int8 / uint8 (dim/8 bytes a row, "
        "encode's precision=; default float32)",
    )
    p.add_argument("--normalize", action="store_true", help="rows of unit length (encode's normalize_embeddings=)")
    p.add_argument("--truncate-dim", type=at_least(1), metavar="K",
                   help="keep each row's first K values, before --normalize and --dtype (encode's truncate_dim=)")  # fmt: skip
    add_threads_arg(p)
    p.add_argument("--strict", action="store_true", help="fail on invalid UTF-8 instead of replacing it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--shard", type=int, help="embed only slice I (0-based) of --num-shards contiguous slices")
    p.add_argument("--num-shards", type=int, help="number of slices the lines are cut into (with --shard)")
    p.add_argument("--concat", nargs="+", metavar=("OUT", "SHARD"), help="join shard .npy files, in order, into OUT")
    add_ray_args(p, "text, one sentence per line (plain or .gz), or Parquet with --text-column")
    p.add_argument("--text-column", default="text", help="with --engine ray: the text column of Parquet inputs")
    args = p.parse_args(argv)
    if args.engine == "ray":
        local = ["sentence_file", "output_file", "concat", "shard", "num_shards", "sp_model", "device"]
        refuse_local_options(p, args, *local, "chunk_lines")
        if not (args.input and args.output_dir):
            p.error("--engine ray needs --input PATTERN... and --output-dir")
        return args
    if args.input or args.output_dir or args.resume:
        p.error(
            "--input, --output-dir and --resume are options of --engine ray (add --engine ray, or use "
            "--sentence-file and --output-file)"
        )
    if args.concat:
        local = ["sentence_file", "output_file", "shard", "num_shards", "load_file", "sp_model", "device", "dtype",
                 "normalize", "truncate_dim"]  # fmt: skip
        refuse_unused(p, args, "--concat", "it joins the shards' rows as they are, and embeds nothing", *local)
        if len(args.concat) < 2:
            p.error("--concat takes OUT and then the shard files in order")
    elif not (args.sentence_file and args.output_file):
        p.error("--sentence-file and --output-file are required (or --concat OUT SHARD...)")
    elif args.sentence_file == "-" and args.shard is not None:
        p.error("--shard needs a file, not standard input: its lines are counted to cut the slices")
    if (args.shard is None) != (args.num_shards is None):
        p.error("--shard and --num-shards go together")
    if args.num_shards is not None and not 0 <= args.shard < args.num_shards:
        p.error(f"--shard must be in 0..{args.num_shards - 1} (0-based) and --num-shards at least 1")
    return args


def score_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(
        SCORE, "paraphrastic-score --sentence-pair-file data/example-sentences-pairs.txt --output-file scores.tsv"
    )
    p.add_argument("--sentence-pair-file", help="UTF-8 text, sentence1<TAB>sentence2 per line; - reads standard input")
    add_model_args(p)
    p.add_argument("--output-file", help="output file (default: stdout)")
    p.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="score lines without exactly one tab nan and list them, instead of stopping",
    )
    add_work_args(p, "pairs")
    add_threads_arg(p)
    p.add_argument("--strict", action="store_true", help="fail on invalid UTF-8 instead of replacing it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_ray_args(p, "sentence1<TAB>sentence2 lines (plain or .gz)")
    args = p.parse_args(argv)
    if args.engine == "ray":
        local = ["sentence_pair_file", "output_file", "sp_model", "device", "chunk_lines"]
        refuse_local_options(p, args, *local)
        if not (args.input and args.output_dir):
            p.error("--engine ray needs --input PATTERN... and --output-dir")
    elif args.input or args.output_dir or args.resume:
        p.error(
            "--input, --output-dir and --resume are options of --engine ray (add --engine ray, or use "
            "--sentence-pair-file)"
        )
    elif not args.sentence_pair_file:
        p.error("--sentence-pair-file is required (or --engine ray with --input)")
    return args


def mine_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(
        MINE, "paraphrastic-mine --source de.txt --target en.txt --load-file multilingual --output-file mined.tsv"
    )
    p.epilog = MINE.split("\n\n", 1)[1] + "\n" + p.epilog
    p.add_argument("--source", help="text file, one sentence per line (bitext mode, with --target)")
    p.add_argument("--target", help="text file, one sentence per line (bitext mode, with --source)")
    p.add_argument("--paraphrase", metavar="FILE", help="mine paraphrase pairs within this one file")
    p.add_argument("--output-file", required=True, help="score<TAB>source<TAB>target lines, best first")
    p.add_argument(
        "--line-numbers",
        action="store_true",
        help="write score<TAB>source line<TAB>target line<TAB>source<TAB>target (1-based line numbers, so that rows "
        "can be dropped by number and repeated lines told apart)",
    )
    p.add_argument(
        "--vectors",
        nargs="+",
        metavar="FILE.npy",
        help="the files' vectors as paraphrastic-embed wrote them (one row per line; --paraphrase: one file, "
        "bitext: source's then target's): read instead of embedding again",
    )
    add_model_args(p)
    p.add_argument("--criterion", choices=["margin", "cosine"], default="margin", help="how candidates are scored")
    p.add_argument(
        "--threshold",
        type=float,
        help=f"keep pairs scoring at least this (default: {DEFAULT_THRESHOLD['margin']} margin, "
        f"{DEFAULT_THRESHOLD['cosine']} cosine; -inf keeps every retrieved pair)",
    )
    p.add_argument(
        "--retrieval",
        choices=["max-score", "forward", "intersect"],
        help="default: max-score; forward with --paraphrase",
    )
    p.add_argument("--k", type=int, default=4, help="neighbours per sentence for the margin (default 4)")
    p.add_argument("--index", choices=["auto", "flat", "ivf"], default="auto", help="auto: ivf past --ivf-min")
    p.add_argument("--ivf-min", type=int, default=100_000, help="indexed sentences from which auto uses IVF")
    p.add_argument("--nlist", type=int, help="IVF lists (default: 4 x sqrt(sentences))")
    p.add_argument("--nprobe", type=int, default=16, help="IVF lists visited per query")
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16", help="vectors on disk")
    p.add_argument("--truncate-dim", type=at_least(1), metavar="K",
                   help="search each sentence's first K values: the index K/dim of the size and the search about "
                   "that much faster, at a cost docs/usage.md measures (default: all)")  # fmt: skip
    p.add_argument("--work-dir", help="where the vector files go (default: a temporary folder beside the output)")
    p.add_argument(
        "--batch-size",
        type=at_least(1),
        default=8192,
        help="sentences per tokenize+pool step (a mean model's: 1,024 at least)",
    )
    p.add_argument(
        "--chunk-lines", type=at_least(1), default=65536, help="lines read, or sentences searched, at a time"
    )
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:N or auto (embedding only)")
    p.add_argument(
        "--threads",
        type=at_least(1),
        help="worker processes for embedding, threads for search (default: the idle cores)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the IVF training sample")
    p.add_argument("--strict", action="store_true", help="fail on invalid UTF-8 instead of replacing it")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="ray: embed on a Ray cluster and search in parallel tasks (pip install \"paraphrastic[ray,mine]\")")  # fmt: skip
    p.add_argument("--address", help="with --engine ray: a running cluster (default: a local Ray on this machine)")
    args = p.parse_args(argv)
    if bool(args.paraphrase) == bool(args.source or args.target) or bool(args.source) != bool(args.target):
        p.error("give either --source and --target (bitext) or --paraphrase FILE")
    if args.k < 1 or args.nprobe < 1 or (args.nlist is not None and args.nlist < 1):
        p.error("--k, --nprobe and --nlist must be at least 1")
    if args.index == "flat":
        refuse_unused(
            p, args, "--index flat", "an exact search has no lists to train or visit", "nlist", "nprobe", "seed"
        )
    if args.engine == "ray":
        refuse_local_options(p, args, "sp_model", "device", "vectors")
    if args.vectors and len(args.vectors) != (1 if args.paraphrase else 2):
        p.error(f"--vectors takes one file per text file: {1 if args.paraphrase else 2} here")
    args.retrieval = args.retrieval or ("forward" if args.paraphrase else "max-score")
    args.threshold = DEFAULT_THRESHOLD[args.criterion] if args.threshold is None else args.threshold
    if math.isnan(args.threshold):  # no score is at least nan: the run would write nothing and say it succeeded
        p.error("--threshold nan keeps no pair: give a number, or -inf to keep every retrieved pair")
    return args


def evaluate_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(EVALUATE, "paraphrastic-evaluate --tasks sts,stsb --data-dir ../shared/data")
    p.add_argument(
        "--load-file",
        nargs="+",
        default=[None],
        metavar="MODEL",
        help="model file, or a shipped model's name: default (English; the default) or multilingual; two or more "
        "are evaluated in turn, then set side by side",
    )
    p.add_argument("--sp-model", help="sentencepiece model of an original-release model file")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument(
        "--batch-size",
        type=at_least(1),
        default=8192,
        help="sentences per embedding batch (a mean model's: 1,024 at least)",
    )
    p.add_argument("--threads", type=at_least(1), help="worker processes, one core each (default: the idle cores)")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated subset of {','.join(TASKS)}")
    p.add_argument("--langs", help=f"Tatoeba languages, comma-separated, or 'all' (default {','.join(DEFAULT_LANGS)})")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir(),
        help="evaluation data: $PARAPHRASTIC_DATA, ../shared/data beside a checkout, else the download's folder "
        "(default %(default)s)",
    )
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--compare", action="store_true", help="print the paper's published SP figures beside ours")
    p.add_argument("--require-all", action="store_true", help="a missing set is an error instead of a skip")
    args = p.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    unknown = sorted(set(args.tasks) - set(TASKS))
    if unknown or not args.tasks:
        p.error(f"--tasks: unknown {','.join(unknown) or '(empty)'}; choose from {','.join(TASKS)}")
    if "tatoeba" not in args.tasks:
        refuse_unused(p, args, f"--tasks {','.join(args.tasks)}", "it picks Tatoeba's languages", "langs")
    return args


def export_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(EXPORT, "paraphrastic-export --output-dir my-model  # then SentenceTransformer('my-model')")
    p.add_argument(
        "--load-file", type=Path, help="model to export: a file, or a shipped model's name (default: the English one)"
    )
    p.add_argument("--output-dir", type=Path, required=True, help="folder to write (created if missing)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --output-dir")
    argv = sys.argv[1:] if argv is None else list(argv)
    return p.parse_args(argv[1:] if argv[:1] == ["export"] else argv)  # `export` was once a subcommand


def demo_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(DEMO, "paraphrastic-demo --corpus sentences.txt", prog="paraphrastic-demo")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=at_least(1), default=7860, help="port to serve on")
    p.add_argument("--corpus", default=str(EXAMPLE_CORPUS), help="the search view's corpus, one sentence per line")
    p.add_argument(
        "--model",
        default="default",
        help="model file, or a shipped model's name: default (English) or multilingual (default: %(default)s)",
    )
    p.add_argument("--max-corpus-lines", type=at_least(1), default=MAX_CORPUS_LINES, help="larger corpora are refused")
    p.add_argument("--threads", type=at_least(1), help="worker processes, one core each (default: the idle cores)")
    return p.parse_args(argv)
