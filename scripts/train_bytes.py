"""Print the sha256 of what a fixed-seed CPU training run writes (model.pt and best.pt, table and fields, and the
losses of metrics.jsonl), for a straight run and for one killed (SIGKILL) after update 3 and resumed, both with one fixed
sentencepiece model, kept in the temporary folder (a trained one records its temporary input's path): run it on two commits to show that a change
of code left training's output as it was.

    python scripts/train_bytes.py [--steps 6]
"""

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FILES = ("model.pt", "best.pt")
KILLED_AT = (
    "import os, signal, sys\nfrom paraphrastic import train\nstep = int(sys.argv[1])\n"
    "train.main(sys.argv[2:], on_step=lambda t: t.step == step and os.kill(os.getpid(), signal.SIGKILL))"
)


def digests(folder: Path) -> dict[str, str]:
    """Per checkpoint, the sha256 of its table's bytes and of its other fields (the `resume` flag it records aside:
    a resumed run says so); and of the losses by update."""
    out = {}
    for name in FILES:
        if (folder / name).exists():
            state = torch.load(folder / name, weights_only=False)
            state["config"].get("training", {}).get("args", {}).pop("resume", None)
            table = state.pop("embedding").contiguous().view(torch.uint8).numpy().tobytes()
            fields = json.dumps(state, sort_keys=True, default=repr).encode()
            out[name] = hashlib.sha256(table).hexdigest()[:16] + "/" + hashlib.sha256(fields).hexdigest()[:16]
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    losses = sorted({m["step"]: m.get("loss") for m in metrics if "step" in m}.items())  # a resumed run logs again
    out["losses"] = hashlib.sha256(json.dumps(losses).encode()).hexdigest()[:16]
    return out


def train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paraphrastic.train", *args], capture_output=True, text=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    tmp = Path(tempfile.gettempdir()) / "paraphrastic-train-bytes"  # one path: a checkpoint records its arguments
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    text, run = tmp / "pairs.tsv", tmp / "run"
    lines = (ROOT / "data" / "example-sentences-pairs.txt").read_text().splitlines()
    text.write_text("\n".join(lines * 40) + "\n")
    sp = Path(tempfile.gettempdir()) / "paraphrastic-train-bytes.sp.model"  # kept: the commits compared share it
    if not sp.exists():
        assert train("--train-file", str(text), "--vocab-size", "200", "--max-steps", "1", "--output-dir",
                     str(tmp / "first")).returncode == 0  # fmt: skip
        shutil.copy(tmp / "first" / "sp.model", sp)
    common = ["--train-file", str(text), "--sp-model", str(sp), "--dim", "32", "--batch-size",
              "16", "--megabatch-size", "2", "--max-steps", str(args.steps), "--save-every", "2", "--seed", "3",
              "--log-every", "1", "--threads", "1", "--output-dir", str(run)]  # fmt: skip
    assert train(*common).returncode == 0
    straight = digests(run)
    shutil.rmtree(run)
    killed = subprocess.run([sys.executable, "-c", KILLED_AT, "3", *common], capture_output=True)
    assert killed.returncode == -9, killed
    assert train(*common, "--resume").returncode == 0
    resumed = digests(run)
    shutil.rmtree(tmp)
    print(json.dumps({"straight": straight, "resumed": resumed, "equal": straight == resumed}))
    sys.exit(0 if straight == resumed else 1)
