"""Our SP models as Hugging Face static-embedding folders (sentence-transformers, model2vec), and back.

`export_folder` writes the layout model2vec saves and sentence-transformers loads as a `StaticEmbedding`:
`model.safetensors` (key `embeddings`), `tokenizer.json`, `config.json`, `modules.json`, plus our
`sentencepiece.model` so `models.import_folder` (what `load_model(folder)` calls) gets the exact tokenizer back.
The `tokenizer.json` is a `tokenizers` Unigram model converted from the sentencepiece model: lowercasing
(when the model lowercases), sentencepiece's own precompiled normalization, its whitespace rules, and
the "▁" word prefix. Runs of characters sentencepiece does not know become one placeholder piece that
sits on the unknown-token row, because model2vec drops the tokenizer's unknown id while we average it.

    paraphrastic-export export --load-file model.pt --output-dir my-model
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from paraphrastic import load_encoder
from paraphrastic.cli import run_cli
from paraphrastic.fileio import ModelError, atomic_output, install_hint, make_folder
from paraphrastic.options import export_args
from paraphrastic.pieces import Tokenizer, proto_fields
from paraphrastic.static import CHECKED, SP_FILE, SPEncoder

if TYPE_CHECKING:
    import tokenizers

    from paraphrastic.models import SPModel

PORTABLE_CONFIG = ("encoder", "lowercase", "dim", "vocab_size")  # what an exported config.json keeps
EXPORTED = {"config.json", "model.safetensors", "tokenizer.json", "modules.json", SP_FILE}  # an export's files
PLACEHOLDER = "\ue000"  # a private-use character: stands for a run of unknown characters
HIDDEN = "\ue001"  # prefixes control pieces (<s>, </s>) so no text can match them; inputs never keep it


def sentencepiece_specs(sp_model: bytes) -> tuple[dict, dict]:
    """(trainer spec, normalizer spec) fields of a sentencepiece model, read without protobuf installed."""
    model = proto_fields(sp_model)
    return proto_fields(model.get(2, b"")), proto_fields(model.get(3, b""))


def hf_tokenizer(tokenizer: Tokenizer) -> tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` giving the same ids as our sentencepiece tokenizer (measured, see README)."""
    from tokenizers import Regex, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import Unigram

    trainer, normalizer = sentencepiece_specs(tokenizer.sp_model)
    if trainer.get(3, 1) != 1 or trainer.get(24, 0):  # model_type UNIGRAM; treat_whitespace_as_suffix
        raise ModelError("only unigram sentencepiece models with the default whitespace prefix can be exported")
    sp = tokenizer.sp
    vocab, known = [], {" "}
    for i in range(len(tokenizer)):
        piece, score = sp.id_to_piece(i), sp.get_score(i)
        if sp.is_unknown(i):
            piece = PLACEHOLDER
        elif sp.is_control(i) or sp.is_unused(i):
            piece = HIDDEN + piece
        elif len(piece) == 1 and piece != "▁":
            known.add(piece)
        vocab.append((piece, score))
    hf = HFTokenizer(Unigram(vocab, None, bool(trainer.get(35, 0))))
    steps = [normalizers.Lowercase()] if tokenizer.lowercase else []
    if normalizer.get(2):
        steps.append(normalizers.Precompiled(normalizer[2]))
    if normalizer.get(4, 1):  # remove_extra_whitespaces
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip()]
    unknown = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in sorted(known)) + "]+"
    steps.append(normalizers.Replace(Regex(unknown), PLACEHOLDER))
    hf.normalizer = normalizers.Sequence(steps)
    prepend = "always" if normalizer.get(3, 1) else "never"  # add_dummy_prefix
    hf.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme=prepend, split=bool(trainer.get(22, 1)))
    return hf


def export_folder(model: SPModel | SPEncoder, folder: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write `model` (load_model's or load_encoder's) as a static-embedding folder that sentence-transformers and
    model2vec load. Its table is float32, what both read: 78 MiB for the shipped English model, whose own file
    holds int8 rows (21.8 MiB). `folder` is new or empty, or with `overwrite` an earlier export: no other file is
    written among, and no earlier export is replaced unasked."""
    if isinstance(model, SPEncoder):
        table = model.table
    else:
        from paraphrastic.models import SPModel  # a model that load_model read: torch is imported already

        if not isinstance(model, SPModel):
            raise ModelError(
                f"a {model.kind} model cannot be exported: static-embedding folders hold one sentencepiece table"
            )
        table = model.embedding.weight.detach().cpu().float().numpy()
    if model.piece_rows is not None:
        raise ModelError("an original-release model has rows that are not sentencepiece ids; it cannot be exported")
    try:
        import tokenizers  # noqa: F401  (hf_tokenizer needs it)
        from safetensors.numpy import save
    except ImportError:
        raise ModelError(f"export needs the interop extra: {install_hint('interop')}") from None
    folder = Path(folder)
    if folder.is_dir() and (others := sorted(p.name for p in folder.iterdir() if not exported(p.name))):
        raise ModelError(f"{folder}: holds files of its own ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); "
                         "export into a new or empty folder")  # fmt: skip
    if folder.is_dir() and not overwrite and any((folder / name).exists() for name in EXPORTED):
        raise ModelError(f"{folder}: holds an earlier export; give --overwrite to replace it, or a new folder")
    make_folder(folder)
    config = {
        "model_type": "model2vec",
        "architectures": ["StaticModel"],
        "hidden_dim": model.dim,
        "normalize": False,
        "max_length": None,
        "pooling": "mean",
        "embedding_dtype": "float32",
        "paraphrastic": {k: v for k, v in model.config.items() if k in PORTABLE_CONFIG},  # nothing of this machine
    }
    modules = [{"idx": 0, "name": "0", "path": ".", "type": "sentence_transformers.models.StaticEmbedding"}]
    files = {
        "model.safetensors": save({"embeddings": np.ascontiguousarray(table)}),
        "tokenizer.json": hf_tokenizer(model.tokenizer).to_str().encode(),
        "modules.json": json.dumps(modules, indent=2).encode(),
        SP_FILE: model.tokenizer.sp_model,
    }
    config["paraphrastic"]["sha256"] = {name: hashlib.sha256(files[name]).hexdigest() for name in CHECKED}
    files["config.json"] = json.dumps(config, indent=2).encode()  # last: it vouches for the files before it
    for name, content in files.items():
        with atomic_output(folder / name) as f:
            f.write(content)
    return folder


def exported(name: str) -> bool:
    """Whether a file name is one an export writes, or the temporary of one that a killed export left."""
    return name in EXPORTED or any(name.startswith(f".{n}.") and name.endswith(".tmp") for n in EXPORTED)


@run_cli
def main(argv: list[str] | None = None) -> int:
    """Write a model as a sentence-transformers / model2vec folder."""
    args = export_args(argv)
    folder = export_folder(load_encoder(args.load_file), args.output_dir, args.overwrite)  # read without torch
    print(f"wrote {folder}: load it with SentenceTransformer({str(folder)!r}) or StaticModel.from_pretrained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
