#!/usr/bin/env bash
# ParaNMT-50M -> English paraphrase pairs filtered as in the paper -> HDF5 training shards.
#
#   cd preprocess/paranmt && bash do_all.sh SIM_LOW SIM_HIGH OVL     (the paper's setting: 0.4 1.0 0.7)
#
# Keeps pairs whose two sides are English (fastText LID), whose paraphrase score is in
# [SIM_LOW, SIM_HIGH], whose trigram overlap is <= OVL and whose sides have 5-40 tokens; then
# lowercases, keeps one copy of each pair, shuffles, trains sentencepiece and writes shards.
# Environment (all optional; see preprocess/README.md):
#   PARANMT_LOCAL  para-nmt-50m.txt or para-nmt-50m.zip already on disk (no download)
#   LID_MODEL      fastText language-ID model (default: lid.176.bin, downloaded)
#   OUT_DIR        output folder (default: ./data/paranmt-sim-low=..-sim-high=..-ovl=..)
#   DOWNLOAD_DIR   where downloads go (default: ./downloads)
#   VOCAB_SIZE (50000)  SHARD_PAIRS (1000000)  SORT_MEMORY (1G)  SEED (0)  WORKERS (all cores)
#   FORCE=1        redo every step even if its output exists
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: bash do_all.sh SIM_LOW SIM_HIGH OVL   (the paper: 0.4 1.0 0.7)" >&2
    exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
default_out=$PWD/data/paranmt-sim-low=$1-sim-high=$2-ovl=$3
source "$here/../common.sh"

paranmt=$("$py" -m paraphrastic.preprocess.download paranmt --downloads "$downloads" ${PARANMT_LOCAL:+--local "$PARANMT_LOCAL"})
lid=$("$py" -m paraphrastic.preprocess.download lid --downloads "$downloads" ${LID_MODEL:+--local "$LID_MODEL"})

step filter-paranmt "$paranmt" --lid-model "$lid" --sim-low "$1" --sim-high "$2" --ovl "$3" \
    --out "$out/filtered.tsv" "${workers[@]}"
step dedup "$out/filtered.tsv" --out "$out/dedup.tsv" --memory "${SORT_MEMORY:-1G}"
step shuffle "$out/dedup.tsv" --out "$out/shuffled.tsv" --seed "${SEED:-0}"
step train-sp "$out/shuffled.tsv" --out "$out/sp.model" --vocab-size "${VOCAB_SIZE:-50000}"
step encode "$out/shuffled.tsv" --sp-model "$out/sp.model" --out "$out/shards" --shard-pairs "${SHARD_PAIRS:-1000000}"

echo "done: shards in $out/shards, sentencepiece model $out/sp.model, counts in $stats" >&2
cat "$stats"
