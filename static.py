"""Text to vectors without torch: the pooling, the embedding API, and our SP checkpoints read as a numpy table
(`SPEncoder`; `paraphrastic.load_encoder` picks it where it can). The piece ids come from `pieces.Tokenizer`.

Importing torch takes about a second, several times the rest of a small job (paraphrastic-embed on the example's ten
lines takes a third of a second without it). An SPEncoder pools with scipy's sparse product until a process has
pooled enough text to repay torch's import, then with torch's embedding_bag, about three times faster; a small batch
of a process's first texts is summed by numpy alone, sparing scipy's import too. All of them sum a bag's rows in
order and divide by its length, so the vectors are the torch Model's bit for bit. models.py's torch `Model` shares
the tokenizer (`pieces`) and the API below; training, GPUs and the other encoders need it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from paraphrastic import language, workers
from paraphrastic.blocks import TAIL_SPLIT
from paraphrastic.fileio import JOB_BYTES, NOT_REGULAR, ModelError, invalid_utf8_note
from paraphrastic.pieces import Tokenizer, fill_empty, offsets_of
from paraphrastic.precision import PRECISIONS, rows_as, scaled_bytes
from paraphrastic.workers import PlacedRows, Workers

DEFAULT_MODEL = Path(__file__).resolve().parent / "data" / "models" / "default.pt"
SHIPPED = {"default": DEFAULT_MODEL, "multilingual": DEFAULT_MODEL.with_name("multilingual.pt")}
PARALLEL_MIN = 20_000  # texts from which embed_raw_text starts worker processes: fewer take well under a second
STREAM_TEXTS = 131_072  # texts of an iterable encode reads at once (and at most STREAM_CHARS characters)
STREAM_CHARS = 32 << 20
JOB_TEXTS = 8192  # texts in one worker's job (and at most JOB_BYTES characters)
MIN_BATCH = 1024  # texts tokenized and pooled at a time, at the least: the rows are the same for any batch, and a
# batch of sentence-transformers' 32 pays a tokenizer call and a pooling call for every 32 texts (half the speed)
UNKNOWN_SHARE = 0.01  # the share of mostly unknown lines from which a run warns that their scores mean little
GATHER_PIECES = 256  # pieces below which a batch may pool without scipy, whose import is 0.1 s of a small command's 0.4
GATHER_SECONDS = 0.1  # the seconds a process may pool so (about the import's), and scipy pools from then on
gathered_seconds = 0.0  # the seconds this process has pooled without scipy (gathered_means)
TORCH_FROM = 2_000_000  # texts a process pools before torch's faster kernel has repaid its import (bench_pooling.py)
AS_IS = functools.partial(rows_as, normalize=False, precision="float32")  # rows as embedded: no `finish`
SP_FILE = "sentencepiece.model"  # an exported folder's copy of the sentencepiece model
CHECKED = ("model.safetensors", "tokenizer.json", SP_FILE)  # the files whose checksums config.json records
ENGLISH_ONLY = (
    "the shipped English model reads English only: for other languages and translations use --load-file multilingual"
)


def text_slices(texts: Sequence[str], most: int, chars: int | None = None) -> list[slice]:
    """Consecutive slices of `texts` of at most `most` texts and `chars` characters (default JOB_BYTES; a longer text
    alone): a batch's memory follows its text, whatever the lengths of the texts."""
    chars = chars or JOB_BYTES
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    out, start = [], 0
    while start < len(texts):
        base = int(ends[start - 1]) if start else 0
        stop = max(start + 1, min(start + most, int(np.searchsorted(ends, base + chars, side="right"))))
        out.append(slice(start, stop))
        start = stop
    return out


def count_cuts(n: int, most: int, workers: int) -> list[slice]:
    """Consecutive slices of `n` texts of `most` each, the last `workers` of them cut TAIL_SPLIT times finer: the
    workers then end within a fraction of a job of each other, not a whole job (as embed's plan does)."""
    cuts = [slice(i, min(i + most, n)) for i in range(0, n, most)]
    if len(cuts) > workers:
        fine, start = max(1, most // TAIL_SPLIT), cuts[-workers].start
        cuts[-workers:] = [slice(i, min(i + fine, n)) for i in range(start, n, fine)]
    return cuts


def sp_rows(flat: np.ndarray, lengths: np.ndarray, piece_rows: np.ndarray | None, unk_row: int):
    """An SP model's table rows of (piece ids, lengths): pieces mapped by `piece_rows` (-1: dropped; None: a row
    per piece), and the unknown row for a text left with none."""
    if piece_rows is not None:
        rows = piece_rows[flat]
        keep = rows >= 0
        owner = np.repeat(np.arange(len(lengths)), lengths)
        flat = rows[keep]
        lengths = np.bincount(owner[keep], minlength=len(lengths)).astype(np.int64)
    return fill_empty(flat, lengths, unk_row)


def mean_rows(table: np.ndarray, flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The mean of each bag's rows of `table`, float32 (len(lengths), dim): the rows summed in order and divided
    by their count, as torch's embedding_bag computes it. With torch loaded its kernel runs; else scipy's sparse
    product, or for a batch of fewer than GATHER_PIECES pieces, numpy alone (`gathered_means`)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        bags = torch.from_numpy(flat), torch.from_numpy(offsets_of(lengths))
        return torch.nn.functional.embedding_bag(bags[0], torch.from_numpy(table), bags[1], mode="mean").numpy()
    if not len(lengths):
        return np.zeros((0, table.shape[1]), np.float32)
    if len(flat) < GATHER_PIECES and gathered_seconds < GATHER_SECONDS:
        return gathered_means(table, flat, lengths)
    from scipy.sparse import csr_array

    ends = np.concatenate([[0], np.cumsum(lengths)])
    sums = csr_array((np.ones(len(flat), np.float32), flat, ends), shape=(len(lengths), len(table))) @ table
    sums /= lengths[:, None].astype(np.float32)
    return sums


def gathered_means(table: np.ndarray, flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """mean_rows without scipy, whose import is a quarter of a small command: each bag's rows added in turn
    (`accumulate` adds in order; + 0 gives a zero sum the sign that the kernels' sums from 0 give it), the same bits.
    It is slower than scipy's product, so a process uses it until it has spent about the import's time on it."""
    global gathered_seconds
    began = time.perf_counter()
    bags = zip(offsets_of(lengths), np.cumsum(lengths), strict=True)
    sums = np.stack([np.add.accumulate(table[flat[start:end]], axis=0)[-1] for start, end in bags])
    sums += np.float32(0)
    sums /= lengths[:, None].astype(np.float32)
    gathered_seconds += time.perf_counter() - began
    return sums


def use_torch_for(texts: int) -> None:
    """Import torch when this process will pool `texts` or more: its kernel then repays the import."""
    if texts >= TORCH_FROM and "torch" not in sys.modules:
        threads = workers.threads()
        import torch

        torch.set_num_threads(threads)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (N, dim) arrays; a zero vector scores 0."""
    num = np.einsum("ij,ij->i", a, b, dtype=np.float64)
    den = np.linalg.norm(a, axis=1).astype(np.float64) * np.linalg.norm(b, axis=1)
    return np.clip(np.divide(num, den, out=np.zeros_like(num), where=den > 0), -1.0, 1.0)


class EvaluationRecord(list):
    """The figures of sentence-transformers' evaluators run on a model (`evaluator(model)` ends by handing them to
    the model's `model_card_data`): one (evaluator's class name, metrics, epoch, step) a call, in order."""

    base_model = None  # the model this one was fine-tuned from, for sentence-transformers' caches: none named

    def set_evaluation_metrics(self, evaluator, metrics: dict, epoch: int = 0, step: int = 0) -> None:
        self.append((type(evaluator).__name__, dict(metrics), epoch, step))


class Encoding:
    """The embedding API every model offers (`encode`, `embed_raw_text`, `score_raw_text`, `similarity`, pools of
    worker processes), over its own `token_ids`, `embed_tokens`, `dim` and `on_cpu`."""

    piece_ids = False  # whether `token_ids` gives the first tokenizer's piece ids (a general model's are rows)
    pooled_by_mean = True  # whether every part pools by the mean, so that a batch's size costs no memory to speak of
    prompts: Mapping[str, str] = types.MappingProxyType({})  # sentence-transformers' named prompts: ours need none
    similarity_fn_name = "cosine"  # what `similarity` computes, by sentence-transformers' name

    def embed_here(
        self, texts: Sequence[str], batch_size: int = 8192, bar=None, stats: dict | None = None, finish=AS_IS
    ) -> np.ndarray:
        """Embed in this process, `batch_size` texts (a mean model's MIN_BATCH at least; JOB_BYTES characters at most)
        at a time: float32 (len(texts), dim), one row per text: each model's `token_ids`, then its `embed_tokens`,
        then what `finish` makes of each batch's rows (encode's `rows_as`). `stats`: where to count the texts that
        are mostly unknown pieces (`count_unknown`), from the same ids."""
        row = self.no_rows(finish)
        out = np.empty((len(texts), row.shape[1]), dtype=row.dtype)
        for cut in text_slices(texts, max(batch_size, MIN_BATCH) if self.pooled_by_mean else batch_size):
            ids = self.token_ids(texts[cut], workers.threads())
            if stats is not None:
                self.count_unknown(texts[cut], stats, ids)
            out[cut] = finish(self.embed_tokens(*ids))
            if bar is not None:
                bar.update(cut.stop - cut.start)
        return out

    def no_rows(self, finish=AS_IS) -> np.ndarray:
        """No rows, as `finish` makes them: the width and type of what is embedded through it."""
        return finish(np.empty((0, self.dim), dtype=np.float32))

    def whole_tokenizers(self) -> None:
        """Build each sentencepiece model whole (a small job's is cut to its texts' pieces, `pieces.CutVocabulary`)."""
        for tokenizer in self.tokenizers:
            if tokenizer.kind == "sp":
                tokenizer.sp  # noqa: B018 - the property builds it

    def before_fork(self) -> None:
        """Build what every worker reads before workers fork, so that they share it instead of each making its own."""
        self.whole_tokenizers()

    def warm_up(self) -> None:
        """Build the whole tokenizers and embed a batch of GATHER_PIECES texts, so that what a job's first batch loads
        (scipy's kernel: 0.1 s) is loaded: a worker does this as it starts, while the caller still plans the jobs,
        not at its first job."""
        self.whole_tokenizers()
        if self.on_cpu:
            self.embed_here(["."] * GATHER_PIECES)

    def embed_raw_text(
        self, texts: Sequence[str], batch_size: int = 8192, pool: Workers | None = None, bar=None
    ) -> np.ndarray:
        """Embed raw sentences: a float32 array (len(texts), dim), one row per text, in order. Inputs of
        PARALLEL_MIN texts or more go to worker processes, one per thread (`use_threads`; `pool`: a kept pool,
        for any size, see `start_multi_process_pool`); the rows are the same bit for bit. `bar`: a tqdm bar to
        advance by the texts done."""
        check_texts(texts, items=False)
        return self._embed(texts, batch_size, pool, bar, checked=False)

    def _embed(
        self, texts: Sequence[str], batch_size: int, pool: Workers | None, bar, checked: bool = True, finish=AS_IS
    ) -> np.ndarray:
        """embed_raw_text's rows, as `finish` makes each batch's (encode's `rows_as`: in the workers, so that the
        output holds only what it makes). Unless `checked`, each text is checked to be a string: by the worker
        processes forked for these texts, each its own slice (a pass over millions of texts takes the caller
        seconds, time in which 16 workers would wait), else here first."""
        one = pool.size == 1 if pool is not None else len(texts) < PARALLEL_MIN or workers.threads() == 1
        here = not len(texts) or one
        forked = pool is None and not here and self.on_cpu
        if not (checked or forked):
            check_texts(texts)
        if here:
            with old_objects_frozen(len(texts)):
                return self.embed_here(texts, batch_size, bar, finish=finish)
        with contextlib.nullcontext(pool) if pool is not None else Workers(self, given=texts) as team:
            most = max(1, min(JOB_TEXTS, -(-len(texts) // team.size)))
            if not self.on_cpu:  # CPU workers tokenize, the device pools
                cuts = text_slices(texts, most)
                jobs = ((texts[cut], batch_size) for cut in cuts)
                parts = [finish(self.embed_tokens(*t)) for t in advancing(team.map(_tokens_job, jobs), cuts, bar)]
                return np.concatenate(parts) if parts else self.no_rows(finish)
            use_torch_for(len(texts) // team.size)  # before the fork: imported once for every worker
            # forked workers hold the texts: a job names its slice, cut by count (each worker's embed_here bounds
            # its batches' characters); a kept pool is sent its texts, in jobs bounded in characters too
            cuts = count_cuts(len(texts), most, team.size) if forked else text_slices(texts, most)
            row = self.no_rows(finish)
            with PlacedRows(len(texts), row.shape[1], row.dtype) as rows:  # a job's rows in a file, then in place
                jobs = ((cut if forked else texts[cut], batch_size, finish, *rows.job_file(cut.start)) for cut in cuts)
                for cut, _ in zip(cuts, advancing(team.map(_embed_job, jobs), cuts, bar), strict=True):
                    rows.place(cut)
        return rows.array

    def encode(
        self,
        sentences: str | Iterable[str],
        batch_size: int = 8192,
        show_progress_bar: bool | None = None,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        normalize_embeddings: bool = False,
        pool: Workers | None = None,
        precision: str = "float32",
        device: str | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate_dim: int | None = None,
        output_value: str = "sentence_embedding",
        chunk_size: int | None = None,
    ):
        """sentence-transformers' `encode`: float32 rows (n, dim), one per sentence, in order; a 1-D vector for one
        string. `sentences` is any iterable of strings: a list is embedded by worker processes as embed_raw_text
        does, and a generator or file is read STREAM_TEXTS at a time through the same workers, so the memory beyond
        the output follows that window, not the corpus (the rows are the same bit for bit). The vectors are means
        of piece vectors, not unit length: `normalize_embeddings=True` makes them so (a dot product is then the
        cosine). `convert_to_tensor`: a torch tensor; `show_progress_bar`: a bar of sentences on stderr;
        `batch_size`: texts tokenized and pooled at a time, 1,024 at least for a model that pools by the mean, whose
        rows are the same for any batch and whose small batches only cost time (sentence-transformers' 32 would
        halve the speed). `precision`: one of PRECISIONS, as sentence-transformers gives them: `binary`/`ubinary`
        pack each row's signs (`signs`; batch by batch, in the workers, so only the packed rows are held), `int8`/
        `uint8` cut each column's range over all the rows (`scaled_bytes`). `device`: where the model is (it is
        not moved). `prompt` (or `prompt_name`, a key of `prompts`): text put before each sentence; `truncate_dim`:
        keep each row's first values (before normalizing and packing, as sentence-transformers does); `chunk_size`
        is left to the pool, as in `encode_multi_process`."""
        precision = precision or "float32"  # sentence-transformers' evaluators give None for it
        self.check_device(device)
        check_encode_arguments(self, batch_size, precision, prompt, pool, truncate_dim, output_value)
        single = isinstance(sentences, str)
        texts = [sentences] if single else sentences
        if prompt or prompt_name:  # as in sentence-transformers, a prompt given wins over a name
            texts = with_prompt(texts, prompt if prompt is not None else self.prompt_named(prompt_name))
        bar = None
        if show_progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=len(texts) if is_sequence(texts) else None, unit=" sent", file=sys.stderr)
        finish = functools.partial(rows_as, normalize=normalize_embeddings, precision=precision, dims=truncate_dim)
        try:
            if is_sequence(texts):
                check_texts(texts, items=False)
                out = self._embed(texts, batch_size, pool, bar, checked=False, finish=finish)
            else:
                out = self.embed_stream(texts, batch_size, pool, bar, finish)
        finally:
            if bar is not None:
                bar.close()
        if precision.endswith("int8"):
            out = scaled_bytes(out, precision)
        out = out[0] if single else out
        if convert_to_tensor or not convert_to_numpy:  # sentence-transformers: a tensor, else a list of them
            import torch

            out = torch.from_numpy(out)
            return out if convert_to_tensor or single else list(out)
        return out

    def embed_stream(
        self, texts: Iterable[str], batch_size: int, pool: Workers | None, bar, finish=AS_IS
    ) -> np.ndarray:
        """encode's rows of an iterable that is no list: windows of it embedded in turn, each window's rows made
        what `finish` makes of them, into an output that grows in place (realloc moves its pages, it does not copy
        them), through one pool of workers for the whole stream."""
        out, n = self.no_rows(finish), 0
        with contextlib.ExitStack() as stack:
            for window in text_windows(texts):
                if pool is None and len(window) >= PARALLEL_MIN and workers.threads() > 1:
                    pool = stack.enter_context(Workers(self))
                rows = self._embed(window, batch_size, pool, bar, finish=finish)  # text_windows checked its texts
                if n + len(rows) > len(out):
                    out.resize((max(2 * len(out), n + len(rows)), out.shape[1]), refcheck=False)
                out[n : n + len(rows)] = rows
                n += len(rows)
                del rows
        out.resize((n, out.shape[1]), refcheck=False)
        return out

    def check_device(self, device) -> None:
        """encode's `device`, sentence-transformers' argument: None or where this model is ("cuda" for any GPU
        it is on); a ValueError says how to load it elsewhere, since encode does not move a model."""
        here = "cpu" if self.on_cpu else str(self.device)
        if device is not None and str(device) not in (here, here.split(":")[0]):
            raise ValueError(
                f"this model is on {here} and encode does not move it: load it with device={str(device)!r} "
                "(paraphrastic.load_model or load_encoder)"
            )

    def start_multi_process_pool(self, workers: int | Sequence[str] | None = None) -> Workers:
        """Worker processes to keep across `encode(..., pool=pool)` calls (default: one per thread): a call without
        one forks its workers anew, which takes longer the more memory this process holds. `workers`: their count,
        or sentence-transformers' list of target devices, "cpu" for each. Close with `pool.close()`,
        `stop_multi_process_pool(pool)`, or use it in a `with` block."""
        if is_whole(workers):
            if workers < 1:
                raise ValueError(f"a pool needs 1 worker or more, not {workers}")
        elif workers is not None:
            if isinstance(workers, str | bytes) or not isinstance(workers, Iterable):
                raise TypeError(f"workers: give their count, or a list of 'cpu', one a worker; not "
                                f"{type(workers).__name__} {workers!r}")  # fmt: skip
            devices = [str(device) for device in workers]
            if not devices or set(devices) != {"cpu"}:
                raise ValueError(
                    f"a pool's workers are processes on this machine's CPU, one core each, not {devices}: give "
                    "their count (or a list of 'cpu', one a worker); a model on a GPU pools there itself"
                )
            workers = len(devices)
        return Workers(self, workers)

    def encode_multi_process(
        self,
        sentences: Iterable[str],
        pool: Workers,
        batch_size: int = 8192,
        chunk_size: int | None = None,
        show_progress_bar: bool | None = None,
        precision: str = "float32",
        normalize_embeddings: bool = False,
    ) -> np.ndarray:
        """sentence-transformers' older name for `encode(sentences, pool=pool)`, the same rows; its `chunk_size` is
        left to the pool, whose jobs are JOB_TEXTS texts."""
        return self.encode(sentences, batch_size, show_progress_bar, normalize_embeddings=normalize_embeddings,
                           pool=pool, precision=precision)  # fmt: skip

    def prompt_named(self, name: str) -> str:
        """The text of the prompt `name` in `prompts` (a ValueError when there is none by that name)."""
        if name not in self.prompts:
            raise ValueError(f"prompt_name {name!r} is none of this model's prompts "
                             f"({', '.join(self.prompts) or 'it has none'}): give the text as prompt=")  # fmt: skip
        return self.prompts[name]

    @staticmethod
    def stop_multi_process_pool(pool: Workers) -> None:
        pool.close()

    def score_raw_text(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 8192, pool: Workers | None = None
    ) -> list[float]:
        """Cosine similarity of each (sentence1, sentence2) pair, in order; NaN where a side is empty or
        blank (there is no text to compare, and the unknown-token vector of both would score 1)."""
        if isinstance(pairs, tuple) and len(pairs) == 2 and all(isinstance(p, str) for p in pairs):
            raise TypeError("score_raw_text takes a list of (sentence1, sentence2) pairs; for one pair pass [(a, b)]")
        if any(isinstance(p, str) or len(p) != 2 for p in pairs):
            raise TypeError("score_raw_text takes a list of (sentence1, sentence2) pairs, each two strings")
        return pair_cosines(pairs, self.embed_raw_text(sides(pairs), batch_size, pool))

    def mostly_unknown(self, texts: Sequence[str]) -> np.ndarray:
        """Per text: are more than half of its pieces (a bare word-start mark aside) unknown to the model?
        Such a text embeds as nearly the unknown piece's vector, so any two of them score near 1."""
        return unknown_in(*self.tokenizers[0].encode_flat(texts), self.tokenizers[0])

    def count_unknown(self, texts: Sequence[str], stats: dict, ids: tuple | None = None, sample: int = 256) -> None:
        """Count in `stats` how many of `texts` are mostly unknown pieces (`unknown_warning` reads it): all of them
        from `ids`, their `token_ids`, where those are piece ids (`piece_ids`); else about `sample` evenly spread
        texts, tokenized again."""
        if ids is None or not self.piece_ids:
            texts = texts[:: max(1, len(texts) // sample)]
            ids = self.tokenizers[0].encode_flat(texts)
        stats["unknown_checked"] = stats.get("unknown_checked", 0) + len(texts)
        stats["mostly_unknown"] = stats.get("mostly_unknown", 0) + int(unknown_in(*ids, self.tokenizers[0]).sum())

    def similarity(self, a: Sequence[str] | np.ndarray, b: Sequence[str] | np.ndarray) -> np.ndarray:
        """Cosine of every row of `a` with every row of `b`, (len(a), len(b)), as sentence-transformers'
        `similarity`: each side is a list of sentences or vectors from `encode` (one vector: one row); a torch
        tensor where a side is one, else numpy's array."""
        x, y = self.sides_of(a, b)
        return as_given(unit_rows(x) @ unit_rows(y).T, a, b)

    def similarity_pairwise(self, a: Sequence[str] | np.ndarray, b: Sequence[str] | np.ndarray) -> np.ndarray:
        """Cosine of row i of `a` with row i of `b`, (len(a),), as sentence-transformers' `similarity_pairwise`."""
        x, y = self.sides_of(a, b)
        if x.shape != y.shape:
            raise ValueError(f"similarity_pairwise takes two sides of one shape, not {x.shape} and {y.shape}")
        return as_given(np.einsum("ij,ij->i", unit_rows(x), unit_rows(y)), a, b)

    def sides_of(self, a: Sequence[str] | np.ndarray, b: Sequence[str] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two sides of `similarity` as vectors of one length; a side cut by `truncate_dim` against a whole one
        is a ValueError that says what to do, not numpy's."""
        x, y = map(self.vectors_of, (a, b))
        if x.shape[-1] != y.shape[-1]:
            raise ValueError(
                f"the two sides have vectors of {x.shape[-1]} and {y.shape[-1]} values: give both sides the same "
                f"truncate_dim (texts given as a side are encoded whole: {self.dim} values)"
            )
        return x, y

    def vectors_of(self, x: Sequence[str] | np.ndarray) -> np.ndarray:
        """A side of `similarity`: its vectors as given, or encoded; packed signs (precision="binary") are refused,
        since the cosine of their bytes means nothing."""
        if not is_vectors(x):
            return np.atleast_2d(self.encode(x))  # one string: one row
        x = np.atleast_2d(x if isinstance(x, np.ndarray) else x.detach().cpu().numpy())  # a tensor on any device
        if x.ndim > 2:
            raise ValueError(f"vectors are rows (n, values) or one vector, not an array of shape {x.shape}")
        if x.dtype in (np.int8, np.uint8) and x.shape[1] != self.dim:
            raise ValueError(
                f"rows of {x.shape[1]} bytes are packed signs (precision='binary'), whose cosine means nothing: "
                "compare them by the share of their bits that agree (docs/usage.md, 'Smaller vectors'); int8 rows "
                "cut by truncate_dim are read as values once given as float32 (rows.astype(np.float32))"
            )
        return x

    @functools.cached_property
    def model_card_data(self) -> EvaluationRecord:
        """Where sentence-transformers' evaluators, called on this model, leave their figures."""
        return EvaluationRecord()

    def get_sentence_embedding_dimension(self) -> int:
        """The vectors' length, by sentence-transformers' name for it (`dim`)."""
        return self.dim

    @property
    def max_seq_length(self) -> float:
        """The longest text read whole, by sentence-transformers' name: no limit (inf, as its static embeddings
        say), since a vector is the mean over all of a text's pieces."""
        return float("inf")

    @max_seq_length.setter
    def max_seq_length(self, value) -> None:
        raise AttributeError(
            f"max_seq_length cannot be set to {value!r}: this model reads every piece of a text (a vector is their "
            "mean), so there is nothing to cut; cut the texts themselves to cut what is read"
        )

    # sentence-transformers' names for the two sides of a search: this model embeds queries and documents alike
    encode_query = encode_document = encode


def is_sequence(texts) -> bool:
    """Whether `texts` can be sliced and counted (a list, a tuple, an array): embedded whole, else streamed (a
    deque, which counts but does not slice, too)."""
    if not hasattr(texts, "__len__") or not hasattr(texts, "__getitem__") or isinstance(texts, Mapping):
        return False
    try:
        texts[:0]
    except (TypeError, KeyError, IndexError):
        return False
    return True


def text_windows(texts: Iterable[str]) -> Iterator[list[str]]:
    """Lists of the texts of an iterable, STREAM_TEXTS and STREAM_CHARS at most (a longer text alone); a TypeError
    names an item that is not a string by its position in the whole stream."""
    if isinstance(texts, Mapping | set | frozenset) or not hasattr(texts, "__iter__"):  # no order, or not texts
        raise TypeError(
            f"texts must be a string or an iterable of strings (a list, a generator), not a {type(texts).__name__}"
        )
    window, chars, at = [], 0, 0
    for text in texts:
        if not isinstance(text, str):
            raise not_a_string(at, text)
        window.append(text)
        chars, at = chars + len(text), at + 1
        if len(window) >= STREAM_TEXTS or chars >= STREAM_CHARS:
            yield window
            window, chars = [], 0
    if window:
        yield window


def with_prompt(texts: Iterable[str], prompt: str) -> Iterable[str]:
    """`prompt` + each text, as sentence-transformers prepends a prompt: a list for a list (checked first, so that
    a bad item is named), else a stream."""
    if is_sequence(texts):
        check_texts(texts)
        return [prompt + text for text in texts]
    return (prompt + text for window in text_windows(texts) for text in window)


def check_encode_arguments(
    model: Encoding,
    batch_size: int,
    precision: str,
    prompt: str | None,
    pool: Workers | None,
    truncate_dim: int | None,
    output_value: str,
) -> None:
    """A TypeError or ValueError naming an encode argument of the wrong kind, or one that this model cannot honour,
    and why, before any text is read."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is none of {', '.join(PRECISIONS)}")
    if not is_whole(batch_size):
        raise TypeError(f"batch_size must be a count of texts, not {type(batch_size).__name__} {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be 1 or more, not {batch_size}")
    if prompt is not None and not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string put before each sentence, not {type(prompt).__name__} {prompt!r}")
    if pool is not None and not isinstance(pool, Workers):
        raise TypeError(f"pool must come from model.start_multi_process_pool(), not {type(pool).__name__} {pool!r}")
    if truncate_dim is not None and not (is_whole(truncate_dim) and 0 < truncate_dim <= model.dim):
        raise ValueError(f"truncate_dim {truncate_dim!r} is not a count of values from 1 to the rows' {model.dim}")
    if output_value != "sentence_embedding":
        raise ValueError(f"output_value {output_value!r}: this model gives sentence embeddings only (the mean of its "
                         "pieces' vectors); 'sentence_embedding' is the one value")  # fmt: skip


def is_whole(x) -> bool:
    """Whether `x` is a whole number, Python's or numpy's (a bool is not one, though Python counts it an int)."""
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def advancing(results: Iterator, cuts: list[slice], bar) -> Iterator:
    """`results`, one a cut, advancing `bar` (when there is one) by each cut's texts."""
    for result, cut in zip(results, cuts, strict=False):
        if bar is not None:
            bar.update(cut.stop - cut.start)
        yield result


def check_texts(texts, items: bool = True, start: int = 0) -> None:
    """TypeError saying what `texts` should be, or (with `items`) naming the first item that is not a string, by its
    position counted from `start`."""
    if isinstance(texts, str):
        raise TypeError("embed_raw_text takes a list of sentences, not a single string (encode takes either)")
    if not is_sequence(texts):
        raise TypeError(f"texts must be a string or a list of strings, not a {type(texts).__name__}")
    if items and not set(map(type, texts)) <= {str}:  # the fast test; a subclass of str (numpy's) passes the slow one
        for i, item in enumerate(texts):
            if not isinstance(item, str):
                raise not_a_string(start + i, item)


@contextlib.contextmanager
def old_objects_frozen(texts: int) -> Iterator[None]:
    """While this process embeds `texts` texts (PARALLEL_MIN or more), garbage collections skip the objects it
    held before (gc.freeze, undone after). A full collection walks every object held, the caller's list of texts
    too, at a cache miss per text, and the batches' allocations start a dozen of them for 1,000,000 texts: skipping
    it makes one thread's encode 13% faster. Left alone where objects are frozen already (a worker, a pre-forking
    server, a command's main)."""
    if texts < PARALLEL_MIN or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def not_a_string(at: int, item) -> TypeError:
    return TypeError(f"texts[{at}] is {type(item).__name__} {item!r:.60}, not a string")


def is_vectors(x) -> bool:
    """Whether `x` is an array of vectors (numpy's, or torch's when torch is loaded), not sentences."""
    torch = sys.modules.get("torch")
    return isinstance(x, np.ndarray) or (torch is not None and isinstance(x, torch.Tensor))


def as_given(scores: np.ndarray, *sides):
    """`scores` as a torch tensor where a side was one (sentence-transformers' evaluators rank them with torch),
    else as numpy's array."""
    torch = sys.modules.get("torch")
    return torch.from_numpy(scores) if torch is not None and any(isinstance(x, torch.Tensor) for x in sides) else scores


def _embed_job(model: Encoding, job: tuple[Sequence[str] | slice, int, Callable, str, int]) -> None:
    """A worker's job: embed its texts, `finish` their rows, and write them into the job's own file
    (`PlacedRows.job_file`)."""
    texts, batch_size, finish, path, at = job
    if isinstance(texts, slice):  # of the caller's texts, which this worker holds since its fork, unchecked
        start, texts = texts.start, workers.given()[texts]
        check_texts(texts, start=start)
    PlacedRows.write(path, at, model.embed_here(texts, batch_size, finish=finish))


def _tokens_job(model: Encoding, job: tuple[Sequence[str], int]) -> tuple[np.ndarray, np.ndarray]:
    return model.token_ids(job[0])


class StoredRows:
    """A model file's table as stored (float32, float16, or int8 rows with float32 row scales), read as float32 rows
    on demand: a small job converts the rows it reads, not the whole table (80,000 x 256 values: 0.1 s, most of a
    small command's model load). Each row comes out with the bits of the whole table's (an int8 value times its
    scale is exact in float32)."""

    def __init__(self, values: np.ndarray, scales: np.ndarray | None = None):
        self.values, self.scales, self.shape = values, scales, values.shape

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        out = self.values[rows].astype(np.float32)
        if self.scales is not None:
            out *= self.scales[rows]
        return out

    def whole(self) -> np.ndarray:
        """The float32 table, scaled in place (a second table-sized array would cost its page faults)."""
        if self.scales is None:
            return np.ascontiguousarray(self.values, np.float32)
        table = self.values.astype(np.float32)
        table *= self.scales
        return table


class SPEncoder(Encoding):
    """An SP model as a numpy table (`paraphrastic.load_encoder`): a text's vector is the mean of its pieces' rows, the same
    bits as the torch SPModel's. `piece_rows` maps piece ids to rows (-1: dropped; None: one row per piece). `table`:
    float32, or StoredRows, made into the float32 table when a job reads more rows than the table has (counted over
    the process's jobs) or before workers fork (`before_fork`): smaller jobs read their own rows."""

    kind = "sp"
    on_cpu = True
    piece_ids = True

    def __init__(self, tokenizer: Tokenizer, table, config: dict, piece_rows=None, unk_row=None):
        self.tokenizer, self.tokenizers, self.config = tokenizer, [tokenizer], config
        self.stored = table if isinstance(table, StoredRows) else StoredRows(table)
        self._table = None if isinstance(table, StoredRows) else table
        self.piece_rows, self.unk_row = piece_rows, tokenizer.unk_id if unk_row is None else unk_row
        self.pooled = 0  # texts this process has pooled, for use_torch_for
        self.gathered = 0  # rows this process has read from `stored`

    @property
    def table(self) -> np.ndarray:
        """The float32 table (made from the stored rows at first use)."""
        if self._table is None:  # two threads at once may both make it: the same values, no lock to pickle
            self._table = self.stored.whole()
        return self._table

    @property
    def dim(self) -> int:
        return self.stored.shape[1]

    def __repr__(self) -> str:
        return f"SPEncoder(rows={len(self.stored)}, dim={self.dim}, lowercase={self.tokenizer.lowercase})"

    def before_fork(self) -> None:
        """Make the float32 table and the whole tokenizer before workers fork, so that they share them instead of
        each making its own."""
        self.table  # noqa: B018 - the property makes it
        super().before_fork()

    def token_ids(self, texts: Sequence[str], num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        return self.tokenizer.encode_flat(texts, num_threads)

    def embed_tokens(self, flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The vectors of texts already tokenized by `token_ids`."""
        self.pooled += len(lengths)
        use_torch_for(self.pooled)  # a long stream (a Ray actor, many encode calls) switches to torch's kernel
        flat, lengths = sp_rows(flat, lengths, self.piece_rows, self.unk_row)
        if self._table is None and self.gathered + len(flat) <= len(self.stored):  # cheaper than the whole table
            self.gathered += len(flat)
            rows, local = np.unique(flat, return_inverse=True)
            return mean_rows(self.stored[rows], local.reshape(-1), lengths)
        return mean_rows(self.table, flat, lengths)


def model_path(path: str | os.PathLike | None) -> Path:
    """The file a model argument names: a path, a shipped model's name ("default", "multilingual") when no
    file of that name exists, or the English default for None."""
    if path is None:
        return DEFAULT_MODEL
    if not isinstance(path, str | os.PathLike) or str(path) == "":
        raise ModelError(f"no model named {path!r}: give a model file or folder, or a shipped model's name: "
                         f"{', '.join(SHIPPED)}")  # fmt: skip
    if str(path) in SHIPPED and not Path(path).exists():
        return SHIPPED[str(path)]
    return Path(path)


def existing_model(path: str | os.PathLike | None) -> Path:
    """model_path's file or folder, or a ModelError saying what to give instead: checked before any reader (and
    torch) is loaded, so that a mistyped name is answered at once."""
    path = model_path(path)
    if not path.exists():
        if path in SHIPPED.values():
            hint = " (the shipped model is not installed; pass a model file)"
        else:
            hint = f" (give a model file or folder, or a shipped model's name: {', '.join(SHIPPED)})"
        raise ModelError(f"{path}: no such model file{hint}")
    if not path.is_file() and not path.is_dir():
        raise ModelError(f"{path}: {NOT_REGULAR}")
    return path


def english_only(path: str | os.PathLike | None) -> bool:
    """Whether a model argument names the shipped English model (for a one-time hint on cross-lingual work)."""
    return model_path(path) == DEFAULT_MODEL


def sides(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """The texts of pairs to embed at once: every first side, then every second side."""
    return [a for a, _ in pairs] + [b for _, b in pairs]


def pair_cosines(pairs: Sequence[tuple[str, str]], vectors: np.ndarray) -> list[float]:
    """Each pair's cosine from the `vectors` of its `sides`; NaN where a side is empty or blank (there is no text
    to compare, and the unknown-token vector of both would score 1)."""
    blank = np.array([not (a.strip() and b.strip()) for a, b in pairs], dtype=bool)
    return np.where(blank, np.nan, cosine(vectors[: len(pairs)], vectors[len(pairs) :])).tolist()


def unknown_in(flat: np.ndarray, lengths: np.ndarray, tokenizer: Tokenizer) -> np.ndarray:
    """Per text of a tokenizer's (flat piece ids, lengths): are more than half of its pieces, a bare word-start
    mark aside, the unknown piece? Found from where the unknown pieces are, which most texts have none of."""
    unknown_at = np.flatnonzero(flat == tokenizer.unk_id)
    if not len(unknown_at):
        return np.zeros(len(lengths), dtype=bool)
    ends = np.cumsum(lengths)
    space = tokenizer.piece_id("\u2581") if tokenizer.kind == "sp" else -1
    space = -1 if space == tokenizer.unk_id else space
    unknown = np.bincount(np.searchsorted(ends, unknown_at, side="right"), minlength=len(lengths))
    spaces = np.bincount(np.searchsorted(ends, np.flatnonzero(flat == space), side="right"), minlength=len(lengths))
    return unknown * 2 > lengths - spaces


def unknown_warning(model: Encoding, stats: dict) -> str | None:
    """The run's one warning about lines the model cannot read (another script or language), or None when they are
    fewer than UNKNOWN_SHARE of those checked (a stray line of emoji in a corpus is no reason to doubt the run)."""
    share = stats.get("mostly_unknown", 0) / max(stats.get("unknown_checked", 0), 1)
    if share < UNKNOWN_SHARE:
        return None
    if model.tokenizers[0].kind != "sp":  # a vocabulary counted on the training text: its gaps are not languages
        hint = (
            f"; this model's {model.tokenizers[0].kind}s are the {len(model.tokenizers[0]):,} most frequent of its "
            "training text: train it on more text or with a larger --max-types, or use a sentencepiece model"
        )
    elif model.config.get("multilingual"):
        hint = ""
    else:
        hint = "; for Arabic, Chinese, French, German, Russian, Spanish or Turkish use --load-file multilingual"
    return (
        f"warning: {100 * share:.1f}% of the sentences checked ({stats['unknown_checked']}) are mostly pieces this model "
        f"does not know, so their vectors are close to one shared vector and their scores mean little{hint}"
    )


def text_notes(model: Encoding, stats: dict, model_arg: str | os.PathLike | None) -> list[str]:
    """What a command says of its input text once it is done: its lines of invalid UTF-8, the lines the model cannot
    read, and, with the shipped English model (`model_arg`), text in another language."""
    notes = [invalid_utf8_note(stats["invalid_utf8_lines"])] if stats["invalid_utf8_lines"] else []
    foreign = language.foreign_warning(stats) if english_only(model_arg) else None
    return notes + [note for note in (unknown_warning(model, stats), foreign) if note]
