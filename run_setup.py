"""What a training run starts from: its model (resumed, from --init-from, or new, with a sentencepiece model
trained on the pairs) and the source of its tokenized pairs (a TSV read into memory, or HDF5 shards)."""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from paraphrastic import evaluate
from paraphrastic.distributed import Ranks
from paraphrastic.encoders import TOKENIZERS, build_vocab
from paraphrastic.fileio import (
    InputError,
    atomic_output,
    open_input,
    refuse_same_file,
    remove_stale_temps,
    reporting_full_disk,
)
from paraphrastic.models import (
    Model,
    SPModel,
    from_checkpoint,
    load_model,
    read_sp_model,
    resolve_device,
)
from paraphrastic.pairs import ShardSet, iter_pairs, shard_paths, tokenize_pairs
from paraphrastic.pieces import Tokenizer, train_sentencepiece
from paraphrastic.resume import check_inputs_unchanged, check_resume_args, load_resume_state
from paraphrastic.static import model_path
from paraphrastic.train_config import OUTPUTS, SP_INPUT, Config, make_config, model_parts
from paraphrastic.workers import use_threads

SP_SENTENCES = 2_000_000  # distinct sentences a new sentencepiece model is trained on


STRUCTURE = ("encoder", "lowercase", "parts", "combine")  # the config keys that say what a model is


def check_inputs(args: argparse.Namespace) -> None:
    """Fail before any work (or output) when an input file is missing or a dev file does not parse, or when one of
    the run's outputs in --output-dir is one of its inputs (--init-from run/model.pt --output-dir run)."""
    files = [args.train_file, args.sp_model, *args.dev_file, *(args.distill or []), *(args.relate or [])]
    for path in files:
        if path is not None:
            open_input(path)
    for path in args.dev_file:
        evaluate.read_sts_pairs(path)  # a bad line fails now, not at the first save
    shards = shard_paths(args.train_shards) if args.train_shards else []
    init = model_path(args.init_from) if args.init_from else None
    for name in OUTPUTS:
        refuse_same_file(args.output_dir / name, init, *files, *shards)


def sentencepiece_from_text(
    path: Path, vocab_size: int, lowercase: bool, skip_bad: bool, threads: int, workdir: Path
) -> bytes:
    """Train the sentencepiece model on the distinct sentences of both sides (at most SP_SENTENCES)."""
    seen: set[int] = set()
    fd, name = tempfile.mkstemp(dir=workdir, prefix=f".{SP_INPUT}.{os.getpid()}.", suffix=".tmp")  # stale: removable
    tmp = Path(name)
    try:
        with open(fd, "w", encoding="utf-8") as f, reporting_full_disk(workdir / SP_INPUT):
            for src, tgt, _ in iter_pairs(path, skip_bad):
                text = "\n".join(itertools.chain(src, tgt))
                fresh = [s for s in (text.lower() if lowercase else text).split("\n") if s and hash(s) not in seen]
                seen.update(map(hash, fresh))
                f.write("".join(s + "\n" for s in fresh))
                if len(seen) >= SP_SENTENCES:
                    break
        if not seen:
            raise InputError(
                f"{path}: no training pairs (every line empty or bad); check the file, or drop --skip-bad-lines"
            )
        return train_sentencepiece(tmp, vocab_size, threads)
    finally:
        tmp.unlink(missing_ok=True)


def warn_if_grouped(source, config: Config, sample: int = 20_000) -> None:
    """Warn when mega-batches of M > 1 meet pairs that share sentences (groups of paraphrases, such as several
    captions of one image): the hardest "negative" is then mostly a paraphrase, and such training collapses."""
    if config.megabatch_size <= 1:
        return
    n = min(len(source), sample)
    sentences = [
        flat[start : start + length].tobytes()
        for flat, lengths in source.read(0, n)
        for start, length in zip((np.cumsum(lengths) - lengths).tolist(), lengths.tolist(), strict=True)
    ]
    counts = Counter(sentences)
    shared = sum(counts[s] > 1 for s in sentences) / max(len(sentences), 1)
    if shared > 0.5:
        tqdm.write(
            f"warning: {shared:.0%} of the sentences of the first {n} pairs occur in more than one pair (groups of "
            f"paraphrases, such as captions of one image); with M > 1 their hardest negatives are mostly "
            f"paraphrases and training collapses (docs/training.md): consider --megabatch-size 1"
        )


def sentencepiece_tokenizer(config: Config, out: Path, threads: int, lowercase: bool) -> Tokenizer:
    """The --sp-model, or one trained on the pairs and saved as sp.model."""
    if config.sp_model is not None:
        return Tokenizer(read_sp_model(config.sp_model), lowercase)
    next(iter_pairs(config.train_file, config.skip_bad_lines), None)  # a bad first line is named before the wait
    tqdm.write(f"training a sentencepiece model ({config.vocab_size} pieces) on {config.train_file}")
    sp = sentencepiece_from_text(config.train_file, config.vocab_size, lowercase, config.skip_bad_lines, threads, out)
    with atomic_output(out / "sp.model") as f:
        f.write(sp)
    tokenizer = Tokenizer(sp, lowercase)
    if len(tokenizer) < config.vocab_size:
        tqdm.write(
            f"note: sentencepiece made {len(tokenizer)} pieces, not the {config.vocab_size} asked: the training "
            "text holds no more distinct pieces (more text gives more; a smaller --vocab-size says what you get)"
        )
    return tokenizer


def new_model(config: Config, out: Path, threads: int, lowercase: bool, sp: Tokenizer | None = None) -> Model:
    """A fresh --model: its tokenizers (sentencepiece given or trained, word and trigram vocabularies counted
    on the pairs), a table drawn from N(0, 1) with the run's seed (as the reference), seeded LSTM weights."""
    parts = model_parts(config.model)
    tokenizers = []
    for _, tokens in parts:
        if tokens == "sp":
            sp = sp or sentencepiece_tokenizer(config, out, threads, lowercase)
            tokenizers.append(sp)
        else:
            tqdm.write(f"counting the {tokens}s of {config.train_file} (top {config.max_types} kept)")
            texts = (src + tgt for src, tgt, _ in iter_pairs(config.train_file, config.skip_bad_lines))
            tokenizers.append(TOKENIZERS[tokens](build_vocab(tokens, texts, config.max_types, lowercase), lowercase))
    table = torch.randn(sum(map(len, tokenizers)), config.dim, generator=torch.Generator().manual_seed(config.seed))
    if parts == [("mean", "sp")]:
        return SPModel(tokenizers[0], table, {"source": "train.py"})
    torch.manual_seed(config.seed)  # the LSTMs' initial weights
    return Model(tokenizers, [pool for pool, _ in parts], table, {"source": "train.py"}, config.combine)


def model_and_source(config: Config, state: dict | None, out: Path, threads: int, init: Model | None):
    """The model (resumed, from --init-from, or new) and the source of its tokenized pairs."""
    model = from_checkpoint(state["model"], out / "resume.pt") if state is not None else init
    if config.train_shards:
        paths = shard_paths(config.train_shards)
        tokens = model_parts(config.model)
        if len(tokens) != 1 or tokens[0][1] != "sp":
            raise InputError(f"--train-shards hold sentencepiece ids; a {config.model} model trains from --train-file")
        sp = model.sp_tokenizer.sp_model if model else read_sp_model(config.sp_model or shards_sp_model(paths[0]))
        source = ShardSet(paths, sp)
        if config.lowercase is not None and config.lowercase != source.lowercase:
            raise InputError(f"{paths[0]}: the shards were encoded with lowercase={source.lowercase}")
        return model or new_model(config, out, threads, source.lowercase, Tokenizer(sp, source.lowercase)), source
    open_input(config.train_file)
    model = model or new_model(config, out, threads, True if config.lowercase is None else config.lowercase)
    tqdm.write(f"tokenizing {config.train_file}")
    return model, tokenize_pairs(config.train_file, model, config.skip_bad_lines, threads)


def shards_sp_model(shard: Path) -> Path:
    """The sentencepiece model that preprocess/ wrote beside the shards (in their folder or its parent)."""
    for folder in (shard.parent, shard.parent.parent):
        if (folder / "sp.model").is_file():
            return folder / "sp.model"
    raise InputError(f"{shard}: no sp.model beside the shards; pass --sp-model, the model they were encoded with")


def load_init_model(path: Path | None, sp_model: Path | None) -> Model | None:
    """The --init-from model (its dimension, parts and combination become the run's), starting with a
    config of its structure only."""
    if path is None:
        return None
    if sp_model is not None:
        raise InputError("--init-from brings its own tokenizers: drop --sp-model")
    init = load_model(path)
    if getattr(init, "piece_rows", None) is not None:
        raise InputError(f"{path}: an original-release model cannot be trained on; load and save it first")
    state = init.checkpoint()
    state["config"] = {k: v for k, v in state["config"].items() if k in STRUCTURE} | {"source": "train.py"}
    return from_checkpoint(state, path)


def resumed_threads(state: dict | None) -> int | None:
    """The CPU threads of the run `state` saved (at most this machine's cores), for a resume given no --threads: a
    CPU's sums and sentencepiece's training depend on the thread count, and the default count follows the load,
    so the run's own count is what continues it exactly."""
    saved = state["args"].get("threads") if state is not None else None
    return min(saved, len(os.sched_getaffinity(0))) if isinstance(saved, int) and saved > 0 else None


def start_run(args: argparse.Namespace, device: str, ranks: Ranks) -> tuple:
    """(config, saved state or None, model, source of pairs, torch device) of the run in --output-dir: new, resumed
    (its settings and inputs checked against the saved run's) or from --init-from; rank 0 trains sentencepiece."""
    out = args.output_dir
    for name in OUTPUTS:
        remove_stale_temps(out / name)  # left by a killed run
    state = load_resume_state(out) if args.resume else None
    if state is None and (out / "resume.pt").exists():
        raise InputError(f"{out}: already holds a training run; pass --resume to continue it or use another directory")
    init = load_init_model(args.init_from, args.sp_model) if state is None else None
    config = make_config(args, device, state, init, ranks)
    if any(k >= config.dim for k in config.nested_dims):
        raise InputError(
            f"--nested-dims {' '.join(map(str, config.nested_dims))}: each must be below the dimension, {config.dim}"
        )
    if state is not None:
        check_resume_args(config, state, out)
        check_inputs_unchanged(config, state, out)
    threads = use_threads(config.threads or resumed_threads(state))
    config = replace(config, threads=threads)  # saved with the run, for its resume
    with ranks.rank_zero_first(config) as setup:  # rank 0 trains sentencepiece, the others reuse it
        model, source = model_and_source(setup, state, out, threads, init)
    if len(source) < 2:
        raise InputError(f"{config.train_file or config.train_shards[0]}: need at least 2 training pairs")
    return config, state, model, source, resolve_device(config.device)
