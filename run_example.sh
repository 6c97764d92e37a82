#!/usr/bin/env bash
# Set up (torch if missing, then this checkout with the test extra), then the main job (the paper's Figure 2):
# embed data/example-sentences.txt and score
# data/example-sentences-pairs.txt with the shipped English model (data/models/default.pt).
set -euo pipefail
cd "$(dirname "$0")"
if ! python -c "import torch" 2>/dev/null; then  # torch first: the CPU build unless this machine has a GPU
    pip_torch() { python -m pip install -q "torch==2.13.0" "$@"; }
    if command -v nvidia-smi >/dev/null; then
        pip_torch && echo "installed torch 2.13.0 from your package index (a GPU machine: its CUDA build)"
    elif python -m pip install -q --dry-run --report - "torch==2.13.0" 2>/dev/null | grep -q '"name": "nvidia-'; then
        pip_torch --index-url https://download.pytorch.org/whl/cpu \
            && echo "installed torch 2.13.0's CPU build from download.pytorch.org (no GPU here; your index's build brings CUDA, about 5 GB)"
    else
        pip_torch && echo "installed torch 2.13.0 from your package index (a CPU build: it brings no CUDA)"
    fi
fi
python -m pip install -q -e ".[test]"                 # the toolkit, and pytest for the tests command
mkdir -p runs
paraphrastic-embed --sentence-file data/example-sentences.txt --output-file runs/example-sentences.npy --quiet
python -c "import numpy as np; e = np.load('runs/example-sentences.npy'); print('embeddings:', e.shape, e.dtype)"
paraphrastic-score --sentence-pair-file data/example-sentences-pairs.txt --quiet
