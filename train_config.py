"""A training run's settings: paraphrastic-train's argument table (its --help), and Config, the parsed
arguments with every default resolved, saved with the run and compared on --resume."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paraphrastic.cli import at_least, cli_parser, device_name, refuse_unused
from paraphrastic.options import STORED_PRECISIONS

if TYPE_CHECKING:  # torch is imported once there is a run to train, never for --help (0.1 s against 1 s)
    from paraphrastic.distributed import Ranks
    from paraphrastic.models import Model

PATH_ARGS = ("train_file", "train_shards", "output_dir", "sp_model", "init_from", "distill", "relate", "dev_file")


SP_INPUT = "sentencepiece-input.txt"  # temporary text a new sentencepiece model is trained on


OUTPUTS = ("model.pt", "best.pt", "resume.pt", "sp.model", SP_INPUT)  # names whose stale temporaries are removed


@dataclass(frozen=True)
class Config:
    """One run's settings: the parsed arguments with every default resolved (--init-from's dimension and
    encoder, the scramble rate, the run's batch under torchrun), fixed from then on; saved in resume.pt
    and compared on --resume (FIXED_ON_RESUME)."""

    train_file: Path | None
    train_shards: tuple[str, ...] | None
    output_dir: Path
    mode: str
    model: str
    combine: str
    scramble_rate: float
    max_types: int
    sp_model: Path | None
    init_from: Path | None
    vocab_size: int
    lowercase: bool | None
    dim: int
    batch_size: int
    megabatch_size: int
    megabatch_anneal: int
    epochs: int
    max_steps: int | None
    lr: float
    delta: float
    dropout: float
    grad_clip: float | None
    mine_precision: str
    one_sided: bool
    distill: tuple[Path, Path] | None
    distill_weight: float
    distill_relational: float
    distill_contrastive: float
    distill_temperature: float
    distill_neighbours: int
    distill_pool: int
    distill_soft: float
    distill_batch_size: int | None
    relate: tuple[Path, Path] | None
    relate_weight: float
    margin_weight: float
    nested_dims: tuple[int, ...]
    save_precision: str
    on_nan: str
    save_every: int
    log_every: int
    dev_file: tuple[Path, ...]
    skip_bad_lines: bool
    seed: int
    device: str
    resume: bool
    force_resume: bool
    threads: int | None
    global_megabatch: bool
    dist_backend: str
    world_size: int

    def plain(self, names_only: bool = False) -> dict:
        """The settings as plain values (paths as strings, tuples as lists), for checkpoints loaded with
        weights_only=True; `names_only` keeps only the file names of paths, so that a model file carries
        nothing of this machine."""
        path = (lambda x: Path(x).name) if names_only else str
        plain = {}
        for k, v in asdict(self).items():
            if isinstance(v, tuple):
                v = list(v)
            if k in PATH_ARGS and v is not None:
                v = [path(x) for x in v] if isinstance(v, list) else path(v)
            plain[k] = v
        return plain


def make_config(
    args: argparse.Namespace, device: str, state: dict | None, init: Model | None, ranks: Ranks | None = None
) -> Config:
    """The run's Config from the parsed arguments and the device this rank trains on: a fresh --init-from
    run takes the model's dimension and encoder, a resumed one those it recorded; LSTMs scramble 30% of
    sentences unless told otherwise."""
    settings = {k: v for k, v in vars(args).items() if k != "quiet"} | {"device": device, "world_size": 1}
    if init is not None:
        settings |= {"dim": init.embedding.embedding_dim, "model": init.kind.replace("+", ","), "combine": init.combine}
    elif state is not None and args.init_from is not None:
        settings |= {k: state["args"][k] for k in ("dim", "model", "combine")}
    if args.scramble_rate is None:
        lstm = any(pool != "mean" for pool, _ in model_parts(settings["model"]))
        settings["scramble_rate"] = 0.3 if lstm else 0.0
    for k in ("train_shards", "distill", "relate", "dev_file"):
        settings[k] = tuple(settings[k]) if settings[k] is not None else None
    settings["nested_dims"] = tuple(sorted(set(settings["nested_dims"] or ())))
    return Config(**(ranks.settings(settings) if ranks is not None else settings))


DISTILL_SETTINGS = ("distill_weight", "distill_relational", "distill_contrastive", "distill_temperature",
                    "distill_neighbours", "distill_pool", "distill_soft", "distill_batch_size")  # fmt: skip


def inert_settings(settings: dict) -> dict[str, list[str]]:
    """The loss options that act on nothing in a run of these settings, by the option of their loss: --distill-*
    without --distill (its batch size still sizes --relate's batches), --relate-weight without --relate."""
    unused = {}
    if settings.get("distill") is None:
        relate = settings.get("relate") is not None
        unused["--distill"] = [k for k in DISTILL_SETTINGS if not (relate and k == "distill_batch_size")]
    if settings.get("relate") is None:
        unused["--relate"] = ["relate_weight"]
    return unused


DISTRIBUTED_HELP = (
    "Launched by torchrun (e.g. torchrun --standalone --nproc_per_node W train.py ...), training runs on W ranks: "
    "--batch-size and --distill-batch-size are per rank, an update takes W x --batch-size pairs and the checkpoint "
    "records that run batch. Each rank trains on its own contiguous slice of every mini-batch; gradients are summed "
    "over ranks so an update follows the mean loss over all W x b pairs. Rank 0 writes all outputs. --resume "
    "works at another world size if W x --batch-size stays the same: the saved mega-batch is finished with its "
    "saved negatives, later ones are split for the new world size."
)


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a torchrun launch, in a --help group that says what a distributed run means."""
    group = parser.add_argument_group("distributed training (torchrun)", DISTRIBUTED_HELP)
    group.add_argument(
        "--global-megabatch",
        action="store_true",
        help="mine negatives over the whole mega-batch of all ranks (W x b x M pairs, all-gathered): a W-rank run "
        "then equals a single process with --batch-size W x b up to float rounding (with --dropout 0: masks are "
        "drawn per rank); default: each rank mines its own b x M pairs",
    )
    group.add_argument(
        "--dist-backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="collective backend; auto: NCCL with --device cuda, gloo on CPU",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli_parser(
        "Train a sentence encoder (SP by default) with the margin loss and mega-batch hard negatives.",
        "paraphrastic-train --train-file pairs.tsv.gz --output-dir runs/sp --vocab-size 8000 --max-steps 2000\n"
        "On caption paraphrases keep --megabatch-size small (1 was best on Multi30k captions): large mega-batches\n"
        "mine captions of near-identical images as negatives and training collapses.",
        prog="paraphrastic-train",
    )
    data = p.add_mutually_exclusive_group()  # required, with --output-dir: checked below, so one error names both
    data.add_argument(
        "--train-file",
        type=Path,
        help="TSV of sentence pairs s1<TAB>s2, or s1<TAB>s2<TAB>GROUP (a whole number: no "
        "sentence is mined as a negative of its own group) (.gz accepted); required, or:",
    )
    data.add_argument("--train-shards", nargs="+", metavar="DIR_OR_FILE", help="HDF5 shards from preprocess/")
    p.add_argument("--output-dir", type=Path, help="model.pt, best.pt, resume.pt, metrics.jsonl (required)")
    p.add_argument(
        "--mode",
        choices=["paraphrase", "bitext"],
        default="paraphrase",
        help="bitext: negatives only from the other language (default: paraphrase)",
    )
    p.add_argument(
        "--model",
        default="sp",
        type=model_spec,
        help="encoder: sp (default), word, trigram, lstm, blstm, gran (recurrent, over sentencepiece pieces), "
        "lstm-word, blstm-word, gran-word; several joined by commas (e.g. word,trigram) are trained jointly, "
        "see --combine",
    )
    p.add_argument(
        "--combine",
        choices=["add", "concat"],
        default="add",
        help="how the vectors of several --model parts make one: add (same dim) or concat (default add)",
    )
    p.add_argument(
        "--scramble-rate",
        type=float,
        help="shuffle a training sentence's token order with this probability (default 0.3 for LSTMs, else 0)",
    )
    p.add_argument(
        "--max-types", type=at_least(1), default=200_000, help="vocabulary of word and trigram models (default 200000)"
    )
    p.add_argument(
        "--sp-model",
        type=Path,
        help="sentencepiece model (default: with --train-shards the sp.model beside them, else one trained on the pairs)",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        help="start from this model's tokenizer and embedding table (any model load_model reads; sets --dim)",
    )
    p.add_argument(
        "--vocab-size", type=at_least(8), default=50000, help="pieces when training sentencepiece (default 50000)"
    )
    p.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lowercase text before sentencepiece (default: yes; shards record their own)",
    )
    p.add_argument("--dim", type=at_least(1), default=1024, help="embedding dimension (default 1024)")
    p.add_argument("--batch-size", type=at_least(1), default=128, help="pairs per update (default 128)")
    p.add_argument(
        "--megabatch-size", type=at_least(1), default=100, help="M: mini-batches pooled for mining (default 100)"
    )
    p.add_argument(
        "--megabatch-anneal",
        type=at_least(0),
        default=150,
        help="grow M by 1 every this many updates, from 1; 0: M from the start (default 150)",
    )
    p.add_argument("--epochs", type=at_least(1), default=25, help="passes over the data (default 25)")
    p.add_argument("--max-steps", type=at_least(1), help="stop after this many updates")
    p.add_argument("--lr", type=at_least(0.0, float), default=0.001, help="Adam learning rate (default 0.001)")
    p.add_argument("--delta", type=at_least(0.0, float), default=0.4, help="margin (default 0.4)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout on the piece embeddings")
    p.add_argument("--grad-clip", type=at_least(0.0, float), help="clip the gradient's L2 norm to this (default off)")
    p.add_argument(
        "--mine-precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="precision of the mining matrix products; auto: bf16 where the hardware does it natively "
        "(CUDA, CPUs with AVX512-BF16 or AMX), fp32 elsewhere, where bf16 is emulated and slower (default auto)",
    )
    p.add_argument("--one-sided", action="store_true", help="negatives only for the source side (eq. 1)")
    p.add_argument(
        "--distill",
        nargs=2,
        type=Path,
        metavar=("SENTENCES", "TARGETS"),
        help="add a distillation loss: pull each sentence's vector toward its row of TARGETS (.npy, one "
        "row per line of SENTENCES, e.g. from teacher.py)",
    )
    p.add_argument(
        "--distill-weight", type=at_least(0.0, float), default=1.0, help="weight of the distillation loss (default 1)"
    )
    p.add_argument(
        "--distill-relational",
        type=at_least(0.0, float),
        default=0.0,
        help="weight of a loss matching the batch's cosine matrix to the teacher's (default 0: off)",
    )
    p.add_argument(
        "--distill-contrastive",
        type=at_least(0.0, float),
        default=0.0,
        help="weight of an in-batch InfoNCE loss: each sentence nearest its own target among the batch's "
        "(default 0: off; the English default model uses 20)",
    )
    p.add_argument(
        "--distill-temperature",
        type=at_least(0.001, float),
        default=0.1,
        help="temperature of --distill-contrastive's cosines (default %(default)s)",
    )
    p.add_argument(
        "--distill-neighbours",
        type=at_least(0),
        metavar="K",
        default=0,
        help="make each distillation batch of anchors and each one's K nearest sentences by the teachers' "
        "targets in a random pool of --distill-pool (hard negatives for --distill-contrastive; default 0: random "
        "batches)",
    )
    p.add_argument(
        "--distill-pool",
        type=at_least(1),
        metavar="N",
        default=4096,
        help="sentences a batch's neighbours are mined from (default %(default)s)",
    )
    p.add_argument(
        "--distill-soft",
        type=at_least(0.0, float),
        metavar="T",
        default=0.0,
        help="--distill-contrastive's labels: the teachers' own distribution over the batch at this temperature "
        "(default 0: one-hot; the English default model uses 0.05 with --distill-neighbours 3)",
    )
    p.add_argument(
        "--distill-batch-size", type=at_least(1), help="sentences per distillation batch (default: --batch-size)"
    )
    p.add_argument(
        "--relate",
        nargs=2,
        type=Path,
        metavar=("SENTENCES", "VECTORS"),
        help="add a relational loss on other sentences, toward another teacher's cosines: VECTORS (.npy, one row "
        "per line of SENTENCES, any dimension, that teacher's own space) set only how the sentences of a batch "
        "relate to each other, not where they lie (batches of --distill-batch-size)",
    )
    p.add_argument(
        "--relate-weight", type=at_least(0.0, float), default=1.0, help="weight of the --relate loss (default 1)"
    )
    p.add_argument(
        "--margin-weight", type=at_least(0.0, float), default=1.0, help="weight of the margin loss (default 1)"
    )
    p.add_argument(
        "--nested-dims",
        type=at_least(1),
        nargs="+",
        metavar="K",
        help="add every loss again on each vector's first K values (e.g. 64 128: nested dimensions, so that "
        "truncate_dim keeps more); each K below --dim (default: none)",
    )
    p.add_argument(
        "--on-nan",
        choices=["stop", "skip"],
        default="stop",
        help="a NaN/inf loss or gradient: stop, keeping the last good checkpoint (exit 3), or skip the batch",
    )
    p.add_argument("--save-every", type=at_least(0), default=0, help="also save every N updates (default: each epoch)")
    p.add_argument(
        "--save-precision",
        choices=STORED_PRECISIONS,
        default="float32",
        help="how model.pt and best.pt store the table: int8 is a quarter of float32's bytes, as the shipped models "
        "(resume.pt keeps float32; default %(default)s)",
    )
    p.add_argument(
        "--log-every", type=at_least(1), default=100, help="metrics.jsonl line every N updates (default 100)"
    )
    p.add_argument(
        "--dev-file",
        type=Path,
        nargs="+",
        default=[],
        help="STS dev files (score<TAB>s1<TAB>s2): Pearson at each save, best.pt by their mean",
    )
    p.add_argument("--skip-bad-lines", action="store_true", help="skip malformed training lines instead of failing")
    p.add_argument("--seed", type=int, default=1, help="seed of the initialisation, data order and dropout")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --output-dir")
    p.add_argument(
        "--force-resume",
        action="store_true",
        help="with --resume: accept training, distillation, tokenizer or init files other than the saved run's "
        "(the training data must hold as many pairs)",
    )
    p.add_argument("--threads", type=at_least(1), default=None, help="CPU threads (default: the idle cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (the run's lines and metrics.jsonl stay)")
    add_distributed_arguments(p)  # --global-megabatch, --dist-backend
    args = p.parse_args(argv)
    missing = [name for name, given in (("--train-file (or --train-shards)", args.train_file or args.train_shards),
                                        ("--output-dir", args.output_dir)) if not given]  # fmt: skip
    if missing:
        p.error(f"{' and '.join(missing)} required")
    for name in ("dim", "batch_size", "megabatch_size", "epochs", "vocab_size", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch_size < 2:
        p.error("--batch-size must be at least 2 (negatives come from the batch)")
    if args.grad_clip == 0:  # the largest gradient norm kept: 0 keeps none (and one below 0 turned them around)
        p.error("--grad-clip must be above 0 (leave it out for no clipping)")
    if not 0.0 <= args.dropout < 1.0:
        p.error("--dropout must be in [0, 1)")
    if not 0.0 <= (args.scramble_rate or 0.0) <= 1.0 or args.max_types < 1:
        p.error("--scramble-rate must be in [0, 1] and --max-types at least 1")
    why = {"--distill": "they shape its loss", "--relate": "it weighs --relate's loss"}
    for loss, unused in inert_settings(vars(args)).items():
        refuse_unused(p, args, f"a run without {loss}", why[loss], *unused)
    if args.init_from is not None:
        refuse_unused(p, args, "--init-from", "the run takes the model's dimension, encoder and combination", "dim",
                      "model", "combine")  # fmt: skip
    return args


PART_NAMES = {
    "sp": ("mean", "sp"),
    "word": ("mean", "word"),
    "trigram": ("mean", "trigram"),
    **{f"{lstm}{suffix}": (lstm, tokens or "sp") for lstm in ("lstm", "blstm", "gran") for suffix, tokens in
       (("", None), ("-sp", "sp"), ("-word", "word"), ("-trigram", "trigram"))},
}  # fmt: skip


def model_spec(text: str) -> str:
    """--model as a canonical comma-separated list of part names (an argparse type)."""
    names = [n.strip().lower() for n in text.split(",")]
    unknown = [n for n in names if n not in PART_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown encoder {unknown[0]!r}; choose from {', '.join(PART_NAMES)}")
    return ",".join(names)


def model_parts(spec: str) -> list[tuple[str, str]]:
    """(pooling, tokens) of each part of a --model spec."""
    return [PART_NAMES[n] for n in spec.split(",")]
