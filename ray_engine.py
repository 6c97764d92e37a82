"""Embedding, scoring and bitext mining past one machine, on Ray Data (`pip install .[ray]`): --engine ray.

The input files are cut into work items (a plain text file at every LINES_PER_ITEM lines, found by one pass of
newline counting; a .gz or Parquet file whole). A pool of Ray actors, each holding the model loaded once and
running on one thread, reads its items with the toolkit's own reader (invalid UTF-8 replaced, the line
limit) and writes their rows as Parquet parts named by item and part number, each written atomically: a task
that Ray retries after a lost worker rewrites the same parts, so every input line is in the output exactly
once. Rows carry `file` (the input's path as given) and `line` (0-based); the driver holds only the plan and the
parts' row counts, never the vectors. Without an --address, a local Ray starts on this machine's cores.
"""

from __future__ import annotations

import functools
import gc
import glob
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from paraphrastic.fileio import Error, InputError, ModelError, decode_raw, iter_line_blocks, line_offsets, open_input
from paraphrastic.static import TORCH_FROM, load_encoder, use_torch_for
from paraphrastic.workers import use_threads

LINES_PER_ITEM = 262_144  # lines of a plain text file in one work item
PART_LINES = 65_536  # rows of one Parquet part
IN_FLIGHT = 2  # work items queued at each actor: one running, one ready
_joined = True  # whether the Ray in use is one this process joined (or was given), not one it started


def ray_module():
    """The ray package, or one clear error naming the extra that brings it."""
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs Ray Data: pip install 'paraphrastic[ray]' (or -e .[ray])") from None
    return ray


def start(address: str | None = None, cpus: int | None = None) -> int:
    """Join the Ray cluster at `address`, or start a local one on this machine's cores; returns its CPUs."""
    global _joined
    ray = ray_module()
    if not ray.is_initialized():
        _joined = bool(address)
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=cpus or len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False)
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def stop() -> None:
    """Shut down the Ray this run started (leaving a cluster it joined), now rather than at exit, where Ray
    first waits half a second for its log lines."""
    ray = ray_module()
    if ray.is_initialized() and not _joined:
        ray.shutdown()


def input_files(patterns: list[str]) -> list[Path]:
    """The files the --input patterns name (globs, sorted; a plain path as is), each checked readable."""
    files = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not found:
            raise InputError(f"{pattern}: no file matches")
        files += [Path(f) for f in found]
    for path in files:
        open_input(path)
    return files


def plan(files: list[Path], lines_per_item: int = LINES_PER_ITEM) -> list[dict]:
    """The work items: (file, its position, item number, first line, byte offset, lines; -1 lines: to the end)."""
    items = []
    for position, path in enumerate(files):
        if path.suffix in (".gz", ".parquet"):  # no seeking into these: one item each
            starts = [(0, 0)]
        else:
            starts = line_offsets(path, lines_per_item)
        for k, (line, offset) in enumerate(starts):
            lines = starts[k + 1][0] - line if k + 1 < len(starts) else -1
            items.append({"file": str(path), "position": position, "item": len(items), "first": line,
                          "offset": offset, "lines": lines})  # fmt: skip
    return items


def read_items(item: dict, text_column: str, strict: bool) -> Iterator[tuple[int, list[str]]]:
    """(first line, 0-based, and the lines) of one work item, PART_LINES lines at a time."""
    path = Path(item["file"])
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        first = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=PART_LINES, columns=[text_column]):
            lines = ["" if t is None else t for t in batch.column(0).to_pylist()]
            yield first, lines
            first += len(lines)
        return
    stop = None if item["lines"] < 0 else item["first"] + item["lines"]
    offset = item["offset"] if path.suffix != ".gz" else None
    for number, blob in iter_line_blocks(path, PART_LINES, item["first"], stop, offset=offset):
        lines, _ = decode_raw(blob, path, number, strict)
        yield number - 1, lines


def actor_model(model: str | None):
    """The model of a Ray actor, loaded once: on one thread (Ray gives every actor one CPU), with torch's pooling
    kernel from the start (an actor's work is long, so the import is soon repaid), and its start-up objects
    frozen out of the garbage collections (they live as long as the actor)."""
    use_threads(1)
    use_torch_for(TORCH_FROM)
    encoder = load_encoder(model)
    gc.freeze()
    return encoder


class Parts:
    """A Ray actor: the model, loaded once, turning work items into Parquet parts (embedding, or scoring with
    `score`); `run_item` returns an item's rows and parts written."""

    def __init__(self, model: str | None, out: str, batch_size: int = 8192, strict: bool = False,
                 score: bool = False, skip_bad: bool = False, text_column: str = "text"):  # fmt: skip
        self.model, self.out = actor_model(model), Path(out)
        self.batch_size, self.strict, self.score, self.skip_bad = batch_size, strict, score, skip_bad
        self.text_column = text_column

    def run_item(self, item: dict) -> dict:
        """One work item: its rows and parts written, or its error (bad input, returned as data so that the
        driver can say it in one line)."""
        try:
            return self.work(item) | {"error": ""}
        except Error as e:
            return {"item": int(item["item"]), "rows": 0, "parts": 0, "error": f"{type(e).__name__}:{e}"}

    def work(self, item: dict) -> dict:
        rows = parts = 0
        for first, lines in read_items(item, self.text_column, self.strict):
            table = self.scores(item["file"], first, lines) if self.score else self.vectors(item["file"], first, lines)
            write_part(self.out / f"part-{int(item['item']):06d}-{parts:05d}.parquet", table)
            rows, parts = rows + len(lines), parts + 1
        return {"item": int(item["item"]), "rows": rows, "parts": parts}

    def vectors(self, file: str, first: int, lines: list[str]):
        import pyarrow as pa

        vectors = self.model.embed_here(lines, self.batch_size)
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])
        return keyed(file, first, len(lines)).append_column("vector", column)

    def scores(self, file: str, first: int, lines: list[str]):
        import pyarrow as pa

        from paraphrastic.score_sentence_pairs import parse_pair_lines

        pairs, _ = parse_pair_lines(lines, file, first + 1, self.skip_bad)
        scores = np.array(self.model.score_raw_text(pairs, self.batch_size), dtype=np.float64)
        return keyed(file, first, len(lines)).append_column("score", pa.array(scores))


def keyed(file: str, first: int, count: int):
    """The key columns of `count` rows from line `first` (0-based) of `file`."""
    import pyarrow as pa

    return pa.table({"file": pa.array([file] * count, pa.string()), "line": pa.array(np.arange(first, first + count))})


def write_part(path: Path, table) -> None:
    """Write one Parquet part under a temporary name and rename it (a retried task writes the same name: the part
    is whole, once). Vectors are stored plain: float rows gain nothing from dictionaries or compression, and
    trying costs more than the embedding."""
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp, compression="none", use_dictionary=["file"], write_statistics=["file", "line"])
    os.replace(tmp, path)


def run(items: list[dict], out: Path, workers: int, actor: type | None = None, **parts) -> dict:
    """Run the work items on `workers` actors (`actor`, Parts by default, made with **parts), IN_FLIGHT items
    queued at each, the next item to the first actor done; returns rows and parts by item. Ray restarts a lost
    actor and runs its items again. Plain Ray actors, not a Ray Data pipeline: its executor takes seconds to
    start, which is much of a job of a few million lines."""
    ray = ray_module()
    if not items:
        return {}
    remote = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=-1)(actor or Parts)
    team = [remote.remote(out=str(out), **parts) for _ in range(min(workers, len(items)))]
    queue, running, done = list(reversed(items)), {}, {}
    for member in team * IN_FLIGHT:
        if queue:
            running[member.run_item.remote(queue.pop())] = member
    while running:
        (ready,), _ = ray.wait(list(running), num_returns=1)
        member = running.pop(ready)
        row = ray.get(ready)
        done[int(row["item"])] = row
        if queue:
            running[member.run_item.remote(queue.pop())] = member
    failed = [str(done[k]["error"]) for k in sorted(done) if done[k]["error"]]
    if failed:  # the first bad input, in input order, as the local commands say it
        kind, _, message = failed[0].partition(":")
        raise (ModelError if kind == "ModelError" else InputError)(message)
    return done


def output_folder(path: str | os.PathLike) -> Path:
    """The --output-dir, made if missing; one that holds parts already is refused (they would mix)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("part-*.parquet")):
        raise InputError(f"{out}: holds Parquet parts of an earlier run already; give an empty or new --output-dir")
    return out


def read_parts(folder: str | os.PathLike, columns: list[str] | None = None):
    """The parts of a --output-dir as one pyarrow Table in input order (by file position, then line)."""
    import pyarrow.parquet as pq

    paths = sorted(Path(folder).glob("part-*.parquet"))
    if not paths:
        raise InputError(f"{folder}: no part-*.parquet files")
    return pq.read_table(paths, columns=columns) if len(paths) > 1 else pq.read_table(paths[0], columns=columns)


def embed_dataset(ds, model: str | None = None, column: str = "text", batch_size: int = 8192, workers: int = 1):
    """A Ray Dataset with a `vector` column added: the embedding of each row's `column`, computed by `workers`
    actors that load the model once each (the Ray Data stage, for pipelines of one's own)."""
    return ds.map_batches(
        Batches, fn_constructor_kwargs={"model": model, "column": column}, batch_size=batch_size,
        batch_format="numpy", compute=ray_module().data.ActorPoolStrategy(size=workers), num_cpus=1,
    )  # fmt: skip


class Batches:
    """A Ray actor for embed_dataset: the model, loaded once; a `vector` column for each batch."""

    def __init__(self, model: str | None, column: str):
        self.model, self.column = actor_model(model), column

    def __call__(self, batch: dict) -> dict:
        batch["vector"] = self.model.embed_here([str(t) for t in batch[self.column]])
        return batch


def main_files(args, what: str, **parts) -> int:
    """paraphrastic-embed or -score --engine ray: plan the --input files, run them on the actors, say what was
    written. `parts`: what Parts takes beyond the model (score=True to score)."""
    files = input_files(args.input)
    load_encoder(args.load_file)  # a bad model fails here, in one line, not in every actor
    out = output_folder(args.output_dir)
    cpus = start(args.address, args.threads)
    items = plan(files)
    done = run(items, out, min(args.threads or cpus, cpus), model=args.load_file, batch_size=args.batch_size,
               strict=args.strict, **parts)  # fmt: skip
    stop()
    rows, written = sum(int(r["rows"]) for r in done.values()), sum(int(r["parts"]) for r in done.values())
    print(f"{what} {rows} lines of {len(files)} files into {written} Parquet parts in {out}", file=sys.stderr)
    return 0


def part_vectors(folder: Path, item: int | None = None) -> np.ndarray:
    """The vectors of one work item's parts (or of all parts) in a folder, in line order, float32 (rows, dim)."""
    import pyarrow.parquet as pq

    paths = sorted(folder.glob("part-*.parquet" if item is None else f"part-{item:06d}-*.parquet"))
    tables = [pq.read_table(path, columns=["vector"]).column("vector").combine_chunks() for path in paths]
    if not tables:
        return np.zeros((0, 0), np.float32)
    dim = tables[0].type.list_size
    return np.concatenate([t.flatten().to_numpy().reshape(-1, dim) for t in tables])


def build_index(folder: str, path: str, rows: np.ndarray, args) -> tuple[str, np.ndarray]:
    """A Ray task: the search structure over the key side's mined rows, as mine_bitext builds it (faiss, exact
    or IVF on a seeded sample, serialized; without faiss the unit vectors for exact search)."""
    from paraphrastic import knn, mine_bitext

    knn.set_faiss_threads(1)
    keys = mine_bitext.Side(Path(path), part_vectors(Path(folder)).astype(args.dtype), rows)
    if not knn.have_faiss():
        return "exact", mine_bitext.side_rows(keys, slice(None))
    import faiss

    return "faiss", faiss.serialize_index(mine_bitext.build_index(keys, mine_bitext.index_kind(len(rows), args), args))


def search_item(index: tuple[str, np.ndarray], folder: str, item: dict, rows: np.ndarray, k: int, args):
    """A Ray task: (position of the item's first mined row, cosines, key positions) of the k nearest keys of each
    mined row in one work item of the query side."""
    from paraphrastic import knn

    knn.set_faiss_threads(1)
    vectors = part_vectors(Path(folder), int(item["item"]))
    lo, hi = np.searchsorted(rows, [item["first"], item["first"] + len(vectors)])
    queries = knn.unit_rows(vectors[rows[lo:hi] - item["first"]].astype(args.dtype)) if hi > lo else None
    if queries is None:
        return int(lo), np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    kind, data = index
    if kind == "exact":
        sims, ids = knn.exact_topk(data, queries, k)
    else:
        import faiss

        sims, ids = faiss.deserialize_index(data).search(queries, k)
    sims[ids < 0] = -np.inf  # an IVF search that found fewer than k
    return int(lo), sims, ids


def nearest(keys, queries, k: int, args, parts: dict):
    """mine_bitext.nearest_keys on Ray: the index built by one task, the query side searched item by item.
    `parts`: each side's (folder of Parquet parts, work items), by its path."""
    ray = ray_module()
    k = min(k, len(keys.rows))
    from paraphrastic import mine_bitext

    mine_bitext.index_kind(len(keys.rows), args)  # faiss where an IVF index is needed, as on one machine
    (key_dir, _), (query_dir, query_items) = parts[keys.path], parts[queries.path]
    index = ray.put(ray.get(ray.remote(num_cpus=1)(build_index).remote(str(key_dir), str(keys.path), keys.rows, args)))
    rows = ray.put(queries.rows)
    search = ray.remote(num_cpus=1)(search_item)
    found = sorted(ray.get([search.remote(index, str(query_dir), item, rows, k, args) for item in query_items]),
                   key=lambda part: part[0])  # fmt: skip
    return np.concatenate([p[1] for p in found]), np.concatenate([p[2] for p in found])


def main_mine(args) -> int:
    """paraphrastic-mine --engine ray: both sides embedded on Ray, then mine_bitext.mine with the search above (the
    keys indexed by one task, the queries searched item by item), its own margin scoring and retrieval on the
    driver (k neighbours a line): the same pairs and scores as on one machine."""
    from paraphrastic import mine_bitext

    same = bool(args.paraphrase)
    files = [Path(p) for p in ([args.paraphrase] if same else [args.source, args.target])]
    cpus = start(args.address, args.threads)
    with mine_bitext.work_dir(args) as work:
        sides, parts = [], {}
        for i, path in enumerate(files):
            folder, items = work / f"side-{i}", plan([path])
            folder.mkdir()
            run(items, folder, min(args.threads or cpus, cpus), model=args.load_file, batch_size=args.batch_size,
                strict=args.strict)  # fmt: skip
            sides.append(mine_bitext.Side(path, None, mine_bitext.mined_rows(path, same, args)))
            parts[path] = folder, items
        source, target = sides[0], sides[-1]
        search = functools.partial(nearest, parts=parts)
        pairs = mine_bitext.mine(source, target, args, same, nearest=search)
        kept = mine_bitext.write_pairs(Path(args.output_file), source, target, pairs, args)
    stop()
    print(f"wrote {kept} of {len(pairs[2])} retrieved pairs to {args.output_file} (Ray)", file=sys.stderr)
    return 0
