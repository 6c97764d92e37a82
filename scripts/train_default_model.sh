#!/usr/bin/env bash
# Retrain the shipped English default model (data/models/default.pt) from the data in ../shared/data:
#   1. the distinct English sentences of the training data (no STS-family text, no Tatoeba);
#   2. a unigram sentencepiece model on them (lowercased);
#   3. teacher.py: each piece embedded by all-MiniLM-L6-v2, PCA to DIM, frequency weights -> init.pt,
#      and teacher targets for the first 200,000 sentences;
#   4. train.py from init.pt: margin loss on the caption pairs (M = 1) + distillation (weight 3) toward the targets,
#      checkpoint chosen on STS 2017 en-en and STS Benchmark dev;
#   5. stored in float16 as data/models/default.pt, then evaluated.
# Needs the teacher extra (pip install -e .[teacher]). Variables: VOCAB (32000), DIM (300), STEPS (3000),
# PARAPHRASTIC_DATA (../shared/data). Usage: bash scripts/train_default_model.sh [OUT_DIR (runs/default)]
set -euo pipefail
cd "$(dirname "$0")/.."
data=${PARAPHRASTIC_DATA:-../shared/data}
out=${1:-runs/default}
vocab=${VOCAB:-32000}
dim=${DIM:-300}
steps=${STEPS:-3000}
mkdir -p "$out"

if [ ! -f "$out/sentences.txt" ]; then
  python scripts/english_sentences.py "$data" > "$out/sentences.txt.tmp"
  mv "$out/sentences.txt.tmp" "$out/sentences.txt"
fi
head -n 200000 "$out/sentences.txt" > "$out/distill.txt"
if [ ! -f "$out/sp.model" ]; then
  python - "$out" "$vocab" <<'PY'
import sys
from pathlib import Path
from models import train_sentencepiece
out, vocab = Path(sys.argv[1]), int(sys.argv[2])
lower = out / "sentences.lower.txt"
lower.write_text((out / "sentences.txt").read_text(encoding="utf-8").lower(), encoding="utf-8")
(out / "sp.model").write_bytes(train_sentencepiece(lower, vocab))
PY
fi
python teacher.py --sp-model "$out/sp.model" --counts-file "$out/sentences.txt" --dim "$dim" \
  --distill-sentences "$out/distill.txt" --output-dir "$out/teacher"
rm -rf "$out/train"
python train.py --init-from "$out/teacher/init.pt" --output-dir "$out/train" \
  --train-file "$data/train/en_paraphrase/multi30k_task2_en_captions.pairs.tsv.gz" \
  --distill "$out/distill.txt" "$out/teacher/targets.npy" --distill-weight 3 \
  --megabatch-size 1 --lr 0.0003 --max-steps "$steps" --save-every 500 \
  --dev-file "$data/sts/2017/en-en.tsv" "$data/sts/en/stsb/dev.tsv"
mkdir -p data/models
python -c "import models, sys; models.load_model(sys.argv[1]).save(sys.argv[2], half=True)" \
  "$out/train/best.pt" data/models/default.pt
python evaluate.py --load-file data/models/default.pt --tasks sts,sts17,stsb,sick --json "$out/eval.json"
