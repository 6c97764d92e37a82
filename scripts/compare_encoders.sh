#!/usr/bin/env bash
# The seed papers' encoders compared on the same data with the same budget (README: "Other encoders").
#
#   bash scripts/compare_encoders.sh                 (from the repo root; every encoder)
#   bash scripts/compare_encoders.sh word lstm       (a subset, by the names below)
#
# Data: 50,000 English caption paraphrase pairs (a seeded sample of the Multi30k task 2 pairs in
# ${PARAPHRASTIC_DATA:-../shared/data}/train/en_paraphrase), one epoch (391 updates of 128 pairs), M = 1
# (captions collapse with larger mega-batches), dim 300, lr 0.01 for the averaging encoders and 0.001
# when an LSTM is involved. Checkpoints every 25 updates; best.pt is selected on STS 2017 en-en only.
# Then STS 2012-2016 and STS Benchmark dev are evaluated (eval.json), and embedding speed is measured
# by benchmarks/bench_encoders.py. Outputs under runs/compare/<name>/. THREADS=1 when the machine is shared.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
data=$(cd "${PARAPHRASTIC_DATA:-../shared/data}" && pwd)
out=runs/compare
threads=${THREADS:-$(nproc)}
mkdir -p "$out"

# name, --model, --combine, --lr
encoders=(
  "sp sp add 0.01"
  "word word add 0.01"
  "trigram trigram add 0.01"
  "word+trigram-add word,trigram add 0.01"
  "word+trigram-concat word,trigram concat 0.01"
  "lstm lstm add 0.001"
  "blstm blstm add 0.001"
  "gran gran add 0.001"
)
wanted=("$@")

pairs="$out/captions50k.tsv"
if [ ! -f "$pairs" ]; then
  python scripts/caption_sample.py "$data/train/en_paraphrase/multi30k_task2_en_captions.pairs.tsv.gz" "$pairs"
fi

for spec in "${encoders[@]}"; do
  read -r name model combine lr <<<"$spec"
  if [ ${#wanted[@]} -gt 0 ] && [[ ! " ${wanted[*]} " =~ " $name " ]]; then
    continue
  fi
  run="$out/$name"
  rm -rf "$run"
  start=$(date +%s)
  paraphrastic-train --train-file "$pairs" --output-dir "$run" --model "$model" --combine "$combine" \
    --dim 300 --vocab-size 8000 --epochs 1 --batch-size 128 --megabatch-size 1 --lr "$lr" \
    --save-every 25 --log-every 25 --threads "$threads" --dev-file "$data/sts/2017/en-en.tsv"
  echo "$(($(date +%s) - start))" >"$run/train_seconds.txt"
  paraphrastic-evaluate --load-file "$run/best.pt" --tasks sts,stsb --json "$run/eval.json" >"$run/eval.txt"
done
