#!/usr/bin/env bash
# Set up, then the main job (the paper's Figure 2): embed data/example-sentences.txt and score
# data/example-sentences-pairs.txt. With no shipped default model yet, a small model is trained first
# (a few minutes on CPU) from the English caption pairs in ../shared/data (or $PARAPHRASTIC_DATA).
set -euo pipefail
cd "$(dirname "$0")"
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e .
mkdir -p runs
model_args=()
if [ ! -f data/models/default.pt ]; then
  small=runs/small/model.pt
  if [ ! -f "$small" ]; then
    data="${PARAPHRASTIC_DATA:-../shared/data}"
    pairs="$data/train/en_paraphrase/multi30k_task2_en_captions.pairs.tsv.gz"
    [ -f "$pairs" ] || { echo "error: $pairs not found: set PARAPHRASTIC_DATA to the data folder" >&2; exit 2; }
    echo "No default model is shipped yet: training a small one into runs/small (a few minutes)..." >&2
    paraphrastic-train --train-file "$pairs" --output-dir runs/small --dim 300 --vocab-size 8000 --megabatch-size 1 --lr 0.003 --max-steps 2000
  fi
  model_args=(--load-file "$small")
fi
paraphrastic-embed --sentence-file data/example-sentences.txt --output-file runs/example-sentences.npy --quiet "${model_args[@]}"
python -c "import numpy as np; e = np.load('runs/example-sentences.npy'); print('embeddings:', e.shape, e.dtype)"
paraphrastic-score --sentence-pair-file data/example-sentences-pairs.txt --quiet "${model_args[@]}"
