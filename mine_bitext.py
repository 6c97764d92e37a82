"""The work of paraphrastic-mine: translation pairs from two text files, or paraphrase pairs from one, by
margin-scored kNN search. What it does and takes, as --help says it: options.MINE and options.mine_args.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraphrastic import knn, language, load_encoder, ray_engine
from paraphrastic.cli import run_cli
from paraphrastic.embed_sentences import embed_file
from paraphrastic.fileio import (
    InputError,
    atomic_output,
    iter_line_chunks,
    open_input,
    refuse_same_file,
    scratch_folder,
)
from paraphrastic.language import foreign_warning
from paraphrastic.options import mine_args as parse_args
from paraphrastic.precision import check_truncate_dim
from paraphrastic.static import english_only, model_path
from paraphrastic.workers import use_threads


@dataclass
class Side:
    """One side of the search: a text file, its vectors (memory-mapped, one row per line) and the lines mined."""

    path: Path
    vectors: np.ndarray
    rows: np.ndarray  # line numbers taking part: non-blank lines (first copies only in paraphrase mode)


# ----------------------------------------------------------------------------- lines and vectors


def scan_lines(path: Path, chunk_lines: int, strict: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per line: whether it is blank, and a hash of its text (to find exact duplicates)."""
    blank, hashes = [], []
    for lines in iter_line_chunks(path, chunk_lines, strict):
        blank.append(np.fromiter(map(len, map(str.strip, lines)), np.int64, len(lines)) == 0)
        hashes.append(np.fromiter(map(hash, lines), np.int64, len(lines)))
    return np.concatenate(blank or [np.zeros(0, bool)]), np.concatenate(hashes or [np.zeros(0, np.int64)])


def mined_rows(path: Path, distinct: bool, args: argparse.Namespace) -> tuple[np.ndarray, int]:
    """Line numbers to mine (the non-blank lines, and with `distinct` only the first copy of each text), and how
    many lines the file has."""
    blank, hashes = scan_lines(path, args.chunk_lines, args.strict)
    rows = np.flatnonzero(~blank)
    if distinct:
        rows = np.sort(rows[np.unique(hashes[rows], return_index=True)[1]])
    return rows, len(blank)


def embed_side(model, path: Path, rows: np.ndarray, out: Path, args: argparse.Namespace) -> Side:
    """Embed a file into `out` (its lines `rows` to mine, picked before: bad text fails before any work)."""
    embed_file(model, path, out, args.dtype, batch_size=args.batch_size, chunk_lines=args.chunk_lines,
               strict=args.strict, quiet=args.quiet, truncate_dim=args.truncate_dim)  # fmt: skip
    return Side(path, np.load(out, mmap_mode="r"), rows)


def given_side(path: Path, rows: np.ndarray, lines: int, vectors: Path, dim: int, args: argparse.Namespace) -> Side:
    """A file's vectors read from `vectors` (--vectors), checked to be a float matrix of one row per line of the
    model's dimension (cut to --truncate-dim)."""
    try:
        matrix = np.load(vectors, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise InputError(f"{vectors}: not a readable .npy file ({e})") from None
    if matrix.ndim != 2 or matrix.dtype.kind != "f" or len(matrix) != lines or matrix.shape[1] < dim:
        raise InputError(
            f"{vectors}: {matrix.dtype} rows of shape {matrix.shape}, where {path} needs float rows, one per each of "
            f"its {lines} lines, of the model's {dim} values (paraphrastic-embed's output for that file)"
        )
    return Side(path, matrix[:, : args.truncate_dim or dim], rows)


def side_rows(side: Side, positions: slice | np.ndarray) -> np.ndarray:
    """Mined rows of a side (positions in side.rows) as unit-length float32 vectors (zero rows stay zero)."""
    return knn.unit_rows(side.vectors[side.rows[positions]])


def lines_at(path: Path, rows: np.ndarray, args: argparse.Namespace) -> np.ndarray:
    """The text of the given line numbers (any order, repeats allowed) with tabs made spaces, reading the file once."""
    wanted = np.unique(rows)
    found: list[str] = []
    start = 0
    for lines in iter_line_chunks(path, args.chunk_lines, args.strict):
        lo, hi = np.searchsorted(wanted, [start, start + len(lines)])
        found += (lines[i].replace("\t", " ") for i in (wanted[lo:hi] - start).tolist())
        start += len(lines)
    return np.array(found, dtype=object)[np.searchsorted(wanted, rows)]


# ----------------------------------------------------------------------------- search


def index_kind(keys: int, args: argparse.Namespace) -> str:
    """flat or ivf for this many keys; IVF and large inputs need faiss, and say how to get it."""
    kind = args.index if args.index != "auto" else ("ivf" if keys >= args.ivf_min else "flat")
    if not knn.have_faiss() and (kind == "ivf" or keys >= args.ivf_min):
        index = "an IVF index" if kind == "ivf" else "an exact index"
        raise InputError(f"faiss is needed to search {keys:,} sentences with {index}: {knn.FAISS_HINT}")
    return kind


def ivf_lists(n: int, args: argparse.Namespace) -> int:
    """IVF lists for n keys: --nlist, else 4 sqrt(n) (k-means is trained on 40 keys per list)."""
    return min(args.nlist or max(1, round(4 * math.sqrt(n))), n)


def build_index(keys: Side, kind: str, args: argparse.Namespace):
    """A faiss inner-product index over the unit vectors of `keys`: exact, or IVF trained on a seeded sample."""
    n, dim, nlist, sample = len(keys.rows), keys.vectors.shape[1], ivf_lists(len(keys.rows), args), None
    if kind == "ivf":
        sample = side_rows(keys, np.sort(np.random.default_rng(args.seed).choice(n, min(n, 40 * nlist), False)))
    index = knn.faiss_index(dim, kind, nlist, args.nprobe, sample)
    from tqdm import tqdm  # here, as in search_chunks: --help and argument errors come without it

    for start in tqdm(
        range(0, n, args.chunk_lines), desc=f"index {keys.path.name}", disable=args.quiet, file=sys.stderr
    ):
        index.add(side_rows(keys, slice(start, start + args.chunk_lines)))
    return index


def searcher(keys: Side, k: int, args: argparse.Namespace) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A function from unit query vectors to the cosines and positions of their k nearest keys: a faiss index
    (exact or IVF), or exact torch search where faiss is not installed."""
    k = min(k, len(keys.rows))
    kind = index_kind(len(keys.rows), args)
    if knn.have_faiss():
        index = build_index(keys, kind, args)
        return lambda q: index.search(q, k)
    table = side_rows(keys, slice(None))
    return lambda q: knn.exact_topk(table, q, k)


def search_chunks(search: Callable, keys: Side, queries: Side, args: argparse.Namespace) -> tuple[np.ndarray, ...]:
    """Run `search` over the queries in chunks (small enough for exact search's score matrix to stay bounded)."""
    from tqdm import tqdm

    step = args.chunk_lines if knn.have_faiss() else max(1, min(args.chunk_lines, (1 << 26) // len(keys.rows)))
    parts = [
        search(side_rows(queries, slice(start, start + step)))
        for start in tqdm(range(0, len(queries.rows), step), desc=f"search {queries.path.name} -> {keys.path.name}",
                          disable=args.quiet, file=sys.stderr)
    ]  # fmt: skip
    sims, ids = (np.concatenate(x) for x in zip(*parts, strict=True))
    sims[ids < 0] = -np.inf  # an IVF search that found fewer than k
    return sims, ids


def nearest_keys(keys: Side, queries: Side, k: int, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """Cosine and position (in keys.rows; -1: none found) of each query's k nearest keys."""
    return search_chunks(searcher(keys, k, args), keys, queries, args)


def drop_self(sims: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Remove each row's own entry from a self-search with k + 1 neighbours (else its last one): k remain."""
    keep = ids != np.arange(len(ids))[:, None]
    keep[keep.all(axis=1), -1] = False
    k = ids.shape[1] - 1
    return sims[keep].reshape(-1, k), ids[keep].reshape(-1, k)


# ----------------------------------------------------------------------------- scoring and retrieval


def neighbourhood(sims: np.ndarray) -> np.ndarray:
    """Mean cosine of each row's k nearest neighbours (those found), the margin's denominator terms."""
    found = np.isfinite(sims)
    return np.where(found, sims, 0).sum(axis=1) / np.maximum(found.sum(axis=1), 1)


MIN_NEIGHBOURHOOD = 0.05  # a mean neighbour cosine below this is no neighbourhood: the ratio would be noise


def margin(cos: np.ndarray, mean_x: np.ndarray, mean_y: np.ndarray) -> np.ndarray:
    """Ratio margin: cos(x, y) / (mean_k cos(x, .) / 2 + mean_k cos(y, .) / 2); -inf where undefined, as where that
    denominator is under MIN_NEIGHBOURHOOD (a model that does not read the language, or lists no longer than k: the
    English model matched three German lines with margins of 15, 2167 and 3)."""
    den = (mean_x + mean_y) / 2
    out = np.full(np.broadcast_shapes(cos.shape, den.shape), -np.inf, np.float64)
    return np.divide(cos, den, out=out, where=(den >= MIN_NEIGHBOURHOOD) & np.isfinite(cos))


def best_candidates(
    sims: np.ndarray, ids: np.ndarray, own: np.ndarray, other: np.ndarray, criterion: str
) -> tuple[np.ndarray, np.ndarray]:
    """Each query's best neighbour under the criterion (its position, -1 if none) and that score."""
    scores = sims.astype(np.float64) if criterion == "cosine" else margin(sims, own[:, None], other[np.maximum(ids, 0)])
    scores = np.where(ids >= 0, scores, -np.inf)
    rows, col = np.arange(len(ids)), scores.argmax(axis=1)
    best = scores[rows, col]
    return np.where(np.isfinite(best), ids[rows, col], -1), best


def one_to_one(src: np.ndarray, tgt: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Candidates kept by greedy matching in decreasing score, each source and target used once (max-score).

    Vectorised in rounds: a candidate that comes first for both its source and its target among those still
    open is one that greedy keeps; it closes the candidates sharing its source or target.
    """
    order = np.lexsort((np.arange(len(score)), -score))
    src, tgt = src[order], tgt[order]
    open_, kept = np.arange(len(order)), []
    while len(open_):
        first_src = np.zeros(len(open_), bool)
        first_src[np.unique(src[open_], return_index=True)[1]] = True
        first_tgt = np.zeros(len(open_), bool)
        first_tgt[np.unique(tgt[open_], return_index=True)[1]] = True
        win = open_[first_src & first_tgt]
        kept.append(win)
        open_ = open_[~(np.isin(src[open_], src[win]) | np.isin(tgt[open_], tgt[win]))]
    return np.sort(order[np.concatenate(kept)]) if kept else np.zeros(0, np.int64)


def retrieve(fwd: tuple, bwd: tuple, retrieval: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source positions, target positions, scores) of the pairs chosen from both directions' best candidates."""
    (fwd_best, fwd_score), (bwd_best, bwd_score) = fwd, bwd
    src_all, tgt_all = np.arange(len(fwd_best)), np.arange(len(bwd_best))
    if retrieval == "forward":
        src, tgt, score = src_all, fwd_best, fwd_score
    elif retrieval == "intersect":
        mutual = (fwd_best >= 0) & (bwd_best[np.maximum(fwd_best, 0)] == src_all)
        src, tgt, score = src_all[mutual], fwd_best[mutual], fwd_score[mutual]
    else:
        src = np.concatenate([src_all, bwd_best])
        tgt = np.concatenate([fwd_best, tgt_all])
        score = np.concatenate([fwd_score, bwd_score])
        found = (src >= 0) & (tgt >= 0)
        src, tgt, score = src[found], tgt[found], score[found]
        keep = one_to_one(src, tgt, score)
        src, tgt, score = src[keep], tgt[keep], score[keep]
    found = (src >= 0) & (tgt >= 0)
    return src[found], tgt[found], score[found]


def mine(
    source: Side, target: Side, args: argparse.Namespace, same: bool = False, nearest: Callable = nearest_keys
) -> tuple[np.ndarray, ...]:
    """(source lines, target lines, scores) of the retrieved pairs, best first, before the threshold.

    `same`: source and target are one side (paraphrase mode): self-matches are removed and each unordered
    pair is returned once. `nearest`: the search, nearest_keys or one of the same signature (Ray's).
    """
    if min(len(source.rows), len(target.rows)) < 1 + same:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    fwd = nearest(target, source, args.k + same, args)
    bwd = None if same else nearest(source, target, args.k, args)
    return select_pairs(source, target, fwd, bwd, args)


def select_pairs(source: Side, target: Side, fwd: tuple, bwd: tuple | None, args: argparse.Namespace) -> tuple:
    """Score the neighbours found both ways and retrieve the pairs (see `mine`); bwd None: a self-search."""
    same = bwd is None
    if same:
        fwd = bwd = drop_self(*fwd)
    own, other = neighbourhood(fwd[0]), neighbourhood(bwd[0])
    src, tgt, score = retrieve(
        best_candidates(*fwd, own, other, args.criterion), best_candidates(*bwd, other, own, args.criterion),
        args.retrieval,
    )  # fmt: skip
    if same:
        lo, hi = np.minimum(src, tgt), np.maximum(src, tgt)
        first = np.unique(lo * max(len(source.rows), 1) + hi, return_index=True)[1]
        src, tgt, score = lo[first], hi[first], score[first]
    order = np.lexsort((src, -score))
    return source.rows[src[order]], target.rows[tgt[order]], score[order]


# ----------------------------------------------------------------------------- output


def write_pairs(out: Path, source: Side, target: Side, pairs: tuple, args: argparse.Namespace) -> int:
    """Write `score<TAB>source<TAB>target` (with --line-numbers, the two 1-based line numbers before the texts) for the
    pairs at or above the threshold, atomically; returns how many."""
    src, tgt, score = pairs
    keep = score >= args.threshold
    src_text = lines_at(source.path, src[keep], args)
    tgt_text = lines_at(target.path, tgt[keep], args)
    numbers = [f"{a + 1}\t{b + 1}\t" for a, b in zip(src[keep].tolist(), tgt[keep].tolist(), strict=True)]
    with atomic_output(out, "w") as f:
        for i in range(0, len(src_text), args.chunk_lines):
            block = slice(i, i + args.chunk_lines)
            at = numbers[block] if args.line_numbers else [""] * len(src_text[block])
            lines = zip(score[keep][block].tolist(), at, src_text[block], tgt_text[block], strict=True)
            f.write("".join(f"{s:.6f}\t{n}{a}\t{b}\n" for s, n, a, b in lines))
    return len(src_text)


def work_dir(args: argparse.Namespace):
    """The folder for the vector files, removed at the end: in --work-dir, else beside the output."""
    parent = Path(args.work_dir or Path(args.output_file).parent)
    parent.mkdir(parents=True, exist_ok=True)
    return scratch_folder(parent, f".{Path(args.output_file).name}.vectors")


def ray_index(vectors: np.ndarray, rows: np.ndarray, path: Path, args: argparse.Namespace) -> tuple[str, object]:
    """A Ray task's search structure over a key side's mined rows, as build_index makes it (faiss, exact or IVF
    on the same seeded sample, serialized to travel); without faiss the unit vectors for exact search."""
    knn.set_faiss_threads(1)
    keys = Side(path, vectors.astype(args.dtype), rows)
    if not knn.have_faiss():
        return "exact", side_rows(keys, slice(None))
    import faiss

    return "faiss", faiss.serialize_index(build_index(keys, index_kind(len(rows), args), args))


def ray_search(index: tuple[str, object], vectors: np.ndarray, k: int, args: argparse.Namespace) -> tuple:
    """A Ray task's search of one work item's query vectors in a structure of ray_index: cosines, key positions."""
    knn.set_faiss_threads(1)
    queries = knn.unit_rows(vectors.astype(args.dtype))
    kind, data = index
    if kind == "exact":
        sims, ids = knn.exact_topk(data, queries, k)
    else:
        import faiss

        sims, ids = faiss.deserialize_index(data).search(queries, k)
    sims[ids < 0] = -np.inf  # an IVF search that found fewer than k
    return sims, ids


def mine_on_ray(args: argparse.Namespace, files: list[Path]) -> int:
    """paraphrastic-mine --engine ray: both sides embedded on Ray into a scratch folder, the keys indexed by one
    task and the queries searched item by item (ray_index, ray_search), then mine()'s own margin scoring and
    retrieval here (k neighbours a line): the same pairs and scores as on one machine."""
    same = bool(args.paraphrase)
    cpus = ray_engine.start(args.address, args.threads)
    try:
        with work_dir(args) as work:
            sides, parts = [], {}
            for i, path in enumerate(files):
                folder, items = work / f"side-{i}", ray_engine.plan([path])
                folder.mkdir()
                ray_engine.run(items, folder, min(args.threads or cpus, cpus), model=args.load_file,
                               batch_size=args.batch_size, strict=args.strict, truncate_dim=args.truncate_dim)  # fmt: skip
                sides.append(Side(path, None, mined_rows(path, same, args)[0]))
                parts[path] = folder, items

            def nearest(keys: Side, queries: Side, k: int, args: argparse.Namespace) -> tuple:
                index_kind(len(keys.rows), args)  # faiss where an IVF index is needed, as on one machine
                build = functools.partial(ray_index, path=keys.path, args=args)
                search = functools.partial(ray_search, args=args)
                key_side = (parts[keys.path][0], keys.rows)
                query_side = (*parts[queries.path], queries.rows)
                return ray_engine.nearest(key_side, query_side, min(k, len(keys.rows)), build, search)

            source, target = sides[0], sides[-1]
            pairs = mine(source, target, args, same, nearest=nearest)
            kept = write_pairs(Path(args.output_file), source, target, pairs, args)
    finally:
        ray_engine.stop()
    print(f"wrote {kept} of {len(pairs[2])} retrieved pairs to {args.output_file} (Ray)", file=sys.stderr)
    return 0


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = use_threads(args.threads)
    knn.set_faiss_threads(threads)
    files = [Path(p) for p in ([args.paraphrase] if args.paraphrase else [args.source, args.target])]
    for path in files:
        open_input(path)
    refuse_same_file(args.output_file, *files, *(args.vectors or []), model_path(args.load_file), args.sp_model)
    if args.engine == "ray":  # a bad model fails here, in one line, not in every task (read without torch)
        model = load_encoder(args.load_file)
    else:
        from paraphrastic.models import load_model  # here: --help and argument errors come before torch

        model = load_model(args.load_file, sp_model=args.sp_model, device=args.device)
    check_truncate_dim(model.dim, args.truncate_dim)
    if english_only(args.load_file):  # a side in German or French mines poor pairs without a word: say so
        for path in files:
            stats: dict = {}
            language.tally(next(iter_line_chunks(path, 2000, args.strict), []), stats, sample=2000)
            if foreign := foreign_warning(stats, f"the first lines of {path}"):
                print(foreign, file=sys.stderr)
    if args.engine == "ray":
        del model  # checked; the tasks load their own, and the driver holds no table through the run
        return mine_on_ray(args, files)
    start = time.perf_counter()
    scans = [mined_rows(path, bool(args.paraphrase), args) for path in files]
    for mined, _ in scans:  # each side is searched as the keys: faiss, where it needs it, before any embedding
        index_kind(len(mined), args)
    with work_dir(args) as work:
        sides = [
            given_side(path, mined, lines, Path(args.vectors[i]), model.dim, args)
            if args.vectors
            else embed_side(model, path, mined, work / f"{i}.npy", args)
            for i, (path, (mined, lines)) in enumerate(zip(files, scans, strict=True))
        ]
        source, target = sides[0], sides[-1]
        pairs = mine(source, target, args, same=bool(args.paraphrase))
        kept = write_pairs(Path(args.output_file), source, target, pairs, args)
    print(
        f"wrote {kept} of {len(pairs[2])} retrieved pairs ({args.criterion} >= {args.threshold:g}, {args.retrieval}) "
        f"to {args.output_file} in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
