"""Our SP models as Hugging Face static-embedding folders (sentence-transformers, model2vec), and back.

`export_folder` writes the layout model2vec saves and sentence-transformers loads as a `StaticEmbedding`:
`model.safetensors` (key `embeddings`), `tokenizer.json`, `config.json`, `modules.json`, plus our
`sentencepiece.model` so `import_folder` (what `load_model(folder)` calls) gets the exact tokenizer back.
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
import torch

from paraphrastic.fileio import HelpFormatter, atomic_output, cli_parser, run_cli
from paraphrastic.models import ModelError, SPModel, Tokenizer, checked_table, load_model

if TYPE_CHECKING:
    import tokenizers

PORTABLE_CONFIG = ("encoder", "lowercase", "dim", "vocab_size")  # what an exported config.json keeps
SP_FILE = "sentencepiece.model"
PLACEHOLDER = "\ue000"  # a private-use character: stands for a run of unknown characters
HIDDEN = "\ue001"  # prefixes control pieces (<s>, </s>) so no text can match them; inputs never keep it
WEIGHT_KEYS = ("embeddings", "embedding.weight")  # model2vec's key, sentence-transformers' key
WEIGHT_DIRS = (".", "0_StaticEmbedding")
CHECKED = (
    "model.safetensors",
    "tokenizer.json",
    SP_FILE,
)  # the files whose checksums config.json records  # where the two libraries put model.safetensors and tokenizer.json


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """Decode a protobuf varint at `i`: (value, next index)."""
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def _proto_fields(data: bytes) -> dict[int, int | bytes]:
    """The first value of each field of a serialized protobuf message (enough for sentencepiece's specs)."""
    fields: dict[int, int | bytes] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i : i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = data[i : i + size], i + size
        else:
            raise ModelError(f"the sentencepiece model is not a protobuf message (wire type {wire})")
        fields.setdefault(key >> 3, value)
    return fields


def sentencepiece_specs(sp_model: bytes) -> tuple[dict, dict]:
    """(trainer spec, normalizer spec) fields of a sentencepiece model, read without protobuf installed."""
    model = _proto_fields(sp_model)
    return _proto_fields(model.get(2, b"")), _proto_fields(model.get(3, b""))


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


def export_folder(model: SPModel, folder: str | os.PathLike) -> Path:
    """Write `model` as a static-embedding folder that sentence-transformers and model2vec load."""
    if not isinstance(model, SPModel):
        raise ModelError(
            f"a {model.kind} model cannot be exported: static-embedding folders hold one sentencepiece table"
        )
    if model.piece_rows is not None:
        raise ModelError("an original-release model has rows that are not sentencepiece ids; it cannot be exported")
    try:
        import tokenizers  # noqa: F401  (hf_tokenizer needs it)
        from safetensors.numpy import save
    except ImportError:
        raise ModelError("export needs the interop extra: pip install .[interop]") from None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = model.embedding.weight.detach().cpu().float().numpy()
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


def check_export(folder: Path) -> None:
    """Refuse a folder whose files do not all come from one export (one interrupted over another), by the
    checksums our config.json records; folders from other tools carry none and pass."""
    path = _find(folder, "config.json")
    try:
        sums = json.loads(path.read_text(encoding="utf-8")).get("paraphrastic", {}).get("sha256") if path else None
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise ModelError(f"{path}: not a valid config.json ({e})") from None
    if not isinstance(sums, dict):
        return
    for name in CHECKED:
        found = _find(folder, name)
        if found is None or hashlib.sha256(found.read_bytes()).hexdigest() != sums.get(name):
            raise ModelError(
                f"{folder}: {name} is not the file its config.json was exported with (an interrupted export?); "
                "export the model again"
            )


def _find(folder: Path, name: str) -> Path | None:
    """`name` at the folder's root or in sentence-transformers' module subfolder."""
    return next((p for d in WEIGHT_DIRS if (p := folder / d / name).is_file()), None)


def is_static_folder(path: Path) -> bool:
    """Whether `path` is a folder in one of the static-embedding layouts."""
    return path.is_dir() and _find(path, "model.safetensors") is not None


def _read_table(folder: Path) -> torch.Tensor:
    """The per-token table, with model2vec's vocabulary quantization (mapping, weights) folded in."""
    try:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
    except ImportError:
        raise ModelError(f"{folder}: reading a static-embedding folder needs `pip install .[interop]`") from None
    path = _find(folder, "model.safetensors")
    try:
        tensors = load_file(path)
    except SafetensorError as e:
        raise ModelError(f"{path}: not a readable safetensors file, truncated or corrupt ({e})") from None
    key = next((k for k in WEIGHT_KEYS if k in tensors), None)
    if key is None:
        raise ModelError(f"{folder}: model.safetensors has no {' or '.join(WEIGHT_KEYS)} tensor")
    table = tensors[key]
    if table.ndim != 2 or table.dtype.kind != "f" or 0 in table.shape:
        raise ModelError(f"{path}: {key} is {table.dtype} of shape {table.shape}, expected a 2-D float table")
    table = table.astype(np.float32)
    if "mapping" in tensors:
        mapping = tensors["mapping"]
        if mapping.ndim != 1 or mapping.dtype.kind not in "iu" or ((mapping < 0) | (mapping >= len(table))).any():
            raise ModelError(f"{path}: its mapping is not a list of rows of the {len(table)}-row table")
        table = table[mapping.astype(np.int64)]
    if "weights" in tensors:
        weights = tensors["weights"]
        if weights.shape != (len(table),) or weights.dtype.kind != "f":
            raise ModelError(f"{path}: its weights are {weights.shape}, expected one float per row ({len(table)})")
        table = table * weights.astype(np.float32)[:, None]
    return checked_table(torch.from_numpy(np.ascontiguousarray(table)), path)


def _tokenizer_json(folder: Path) -> dict:
    path = _find(folder, "tokenizer.json")
    if path is None:
        raise ModelError(f"{folder}: no tokenizer.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: not a valid tokenizer.json ({e})") from None


def _lowercases(spec: dict | None) -> bool:
    """Whether a tokenizer.json normalizer (possibly a Sequence) lowercases."""
    if not spec:
        return False
    return spec.get("type") == "Lowercase" or any(map(_lowercases, spec.get("normalizers", [])))


def import_folder(folder: str | os.PathLike) -> SPModel:
    """A static-embedding folder as an SPModel: its table, and the sentencepiece model it ships.

    Only sentencepiece-based folders are supported (ours, or any whose rows are sentencepiece ids):
    a WordPiece or BPE tokenizer.json cannot drive this toolkit's sentencepiece tokenizer.
    """
    folder = Path(folder)
    if not is_static_folder(folder):
        raise ModelError(f"{folder}: a folder, but not a static-embedding model (no model.safetensors)")
    check_export(folder)
    spec = _tokenizer_json(folder)
    sp_path = _find(folder, SP_FILE)
    if sp_path is None:
        kind = (spec.get("model") or {}).get("type", "unknown")
        hint = (
            f"; if sentence-transformers re-saved an exported model, copy {SP_FILE} into it"
            if kind == "Unigram"
            else ""
        )
        raise ModelError(
            f"{folder}: no {SP_FILE}: only static models built on a sentencepiece model can be imported, "
            f"and this tokenizer.json is {kind}{hint}"
        )
    tokenizer = Tokenizer(sp_path.read_bytes(), _lowercases(spec.get("normalizer")))
    return SPModel(tokenizer, _read_table(folder), {"source": folder.name})


@run_cli
def main(argv: list[str] | None = None) -> int:
    """`export`: write a model as a sentence-transformers / model2vec folder."""
    parser = cli_parser(
        __doc__, "paraphrastic-export export --output-dir my-model  # then SentenceTransformer('my-model')"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser(
        "export", help="write a model as a static-embedding folder", formatter_class=HelpFormatter
    )
    export.add_argument("--load-file", type=Path, help="model to export (any path load_model reads; default model)")
    export.add_argument("--output-dir", type=Path, required=True, help="folder to write (created if missing)")
    args = parser.parse_args(argv)
    folder = export_folder(load_model(args.load_file), args.output_dir)
    print(f"wrote {folder}: load it with SentenceTransformer({str(folder)!r}) or StaticModel.from_pretrained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
