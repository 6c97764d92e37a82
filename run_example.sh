#!/usr/bin/env bash
# Set up (torch if missing, then this checkout with the test extra), then the main job (the paper's Figure 2):
# embed data/example-sentences.txt and score
# data/example-sentences-pairs.txt with the shipped English model (data/models/default.pt).
set -euo pipefail
cd "$(dirname "$0")"
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"                 # the toolkit, and pytest for the tests command
mkdir -p runs
paraphrastic-embed --sentence-file data/example-sentences.txt --output-file runs/example-sentences.npy --quiet
python -c "import numpy as np; e = np.load('runs/example-sentences.npy'); print('embeddings:', e.shape, e.dtype)"
paraphrastic-score --sentence-pair-file data/example-sentences-pairs.txt --quiet
