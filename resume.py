"""Resuming a run exactly: the training state's format and its checks, the settings and inputs that must not
change (inputs compared by the sha256 of their whole content), and a log cut back to its last whole line."""

from __future__ import annotations

from pathlib import Path

import torch

from paraphrastic.fileio import InputError, file_digest
from paraphrastic.models import TRAIN_STATE
from paraphrastic.train_config import Config, inert_settings

STATE_FORMAT = TRAIN_STATE


STATE_VERSION = 2


# Arguments that must not change on --resume (the others, e.g. --max-steps, may).
FIXED_ON_RESUME = (
    "mode", "dim", "batch_size", "megabatch_size", "megabatch_anneal", "lr", "delta", "dropout",
    "grad_clip", "one_sided", "seed", "mine_precision", "distill_weight", "distill_batch_size",
    "distill_relational", "distill_contrastive", "distill_temperature", "distill_neighbours", "distill_pool",
    "distill_soft", "relate_weight", "margin_weight", "model", "combine", "scramble_rate", "max_types",
    "nested_dims",
)  # fmt: skip


LATER_SETTINGS = {
    "distill_relational": 0.0,
    "distill_contrastive": 0.0,
    "distill_temperature": 0.1,
    "distill_neighbours": 0,
    "distill_pool": 4096,
    "distill_soft": 0.0,
    "relate": None,
    "relate_weight": 1.0,
    "nested_dims": [],
}  # settings newer than some saved runs: their value in those runs


# Inputs that must be the same files on --resume (unless --force-resume): paths compared as absolute paths.
INPUTS_ON_RESUME = ("train_file", "train_shards", "distill", "relate", "lowercase", "sp_model", "init_from")


# The parts of a training state that resuming reads, with their types.
STATE_PARTS = {
    "args": dict,
    "model": dict,
    "optimizer": dict,
    "position": dict,
    "num_pairs": int,
    "torch_rng": torch.Tensor,
}


START_OVER = "move it away to start the run over, or restore a copy"


def load_resume_state(out: Path) -> dict:
    """The training state of the run in `out`, checked for its format and the parts resuming reads."""
    path = out / "resume.pt"
    if not path.exists():
        raise InputError(f"{path}: no training state to resume (run without --resume to start)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable state is one clear error
        raise InputError(f"{path}: not a readable training state ({str(e).splitlines()[0]})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InputError(f"{path}: not a training state written by train.py")
    version = state.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= STATE_VERSION:
        raise InputError(
            f"{path}: training state format {version!r}; this paraphrastic reads versions up to {STATE_VERSION} "
            "(a newer version wrote it: upgrade paraphrastic to resume it)"
        )
    wrong = [k for k, kind in STATE_PARTS.items() if not isinstance(state.get(k), kind)]
    position, optimizer = state.get("position"), state.get("optimizer")
    if isinstance(position, dict) and not all(
        isinstance(position.get(k), int) and position[k] >= 0 for k in ("step", "epoch", "offset", "inner")
    ):
        wrong.append("position")
    if isinstance(optimizer, dict) and not (
        isinstance(optimizer.get("steps"), int) and isinstance(optimizer.get("moments"), torch.Tensor)
    ):
        wrong.append("optimizer")
    if not isinstance(state.get("megabatch_pairs", 0), int) or not isinstance(state.get("skipped", 0), int):
        wrong.append("megabatch_pairs or skipped")
    if wrong:
        raise InputError(f"{path}: damaged training state (missing or malformed: {', '.join(wrong)}); {START_OVER}")
    return state


def check_resume_args(config: Config, state: dict, out: Path) -> None:
    """Refuse to resume with settings or inputs other than the saved run's, naming each one that differs."""
    saved = LATER_SETTINGS | state["args"]
    # a loss's options without their loss acted on nothing: runs of versions that took them must resume without them
    unused = {k for keys in inert_settings(saved).values() for k in keys}
    plain = config.plain()
    changed = [k for k in FIXED_ON_RESUME if k not in unused and saved.get(k) != plain[k]]
    if not config.force_resume:
        changed += [k for k in INPUTS_ON_RESUME if same_inputs(saved.get(k)) != same_inputs(getattr(config, k))]
    if changed:
        diff = ", ".join(f"--{k.replace('_', '-')} {saved.get(k)} -> {config.plain()[k]}" for k in changed)
        hint = "" if config.force_resume else "; --force-resume accepts other input files"
        raise InputError(f"{out / 'resume.pt'}: cannot resume with different settings ({diff}){hint}")


def fingerprint(path: Path) -> str:
    """A file's size and the sha256 of its whole content (streamed: seconds for 10 GB)."""
    return f"{path.stat().st_size}:sha256:{file_digest(path)}"


def same_content(saved: str, now: str) -> bool:
    """Whether two fingerprints name the same content; a run saved before whole-content hashes is compared by size."""
    return saved == now if ":sha256:" in saved else saved.split(":")[0] == now.split(":")[0]


def input_fingerprints(config: Config) -> dict[str, str]:
    """The fingerprint of each training input file, by path, saved in resume.pt and compared on --resume."""
    paths = [config.train_file, *(config.train_shards or ()), *(config.distill or ()), *(config.relate or ())]
    return {str(p): fingerprint(Path(p)) for p in paths if p is not None and Path(p).is_file()}


def check_inputs_unchanged(config: Config, state: dict, out: Path) -> None:
    """Refuse to resume on input files whose content changed since they were saved (same path, other data),
    unless --force-resume."""
    saved = state.get("inputs")
    if not isinstance(saved, dict) or config.force_resume:
        return
    now = input_fingerprints(config)
    changed = [path for path, value in saved.items() if path in now and not same_content(str(value), now[path])]
    if changed:
        raise InputError(
            f"{out / 'resume.pt'}: {', '.join(changed)} changed since the run was saved (same name, other content); "
            "resume on the original file, or pass --force-resume to go on with the new one"
        )


def same_inputs(value):
    """An input argument in a form that compares equal for the same files (absolute paths)."""
    if isinstance(value, list | tuple):
        return [same_inputs(v) for v in value]
    return str(Path(value).resolve()) if isinstance(value, str | Path) else value


def drop_torn_line(path: Path) -> None:
    """Cut an append-only log back to its last complete line (a kill can leave half a line at its end)."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
