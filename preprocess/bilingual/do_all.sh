#!/usr/bin/env bash
# OPUS bitext (English paired with each language) -> one shared sentencepiece model -> HDF5 shards.
#
#   cd preprocess/bilingual && bash do_all.sh fr-es-de
#   BITEXT_LOCAL=/work/shared/data/train/bitext bash do_all.sh de-fr-zh      (local files, no download)
#
# Per language: the paper's OPUS corpora (OpenSubtitles 2018, Tanzil, Europarl for Spanish,
# Global Voices, MultiUN), English side 3-100 tokens, lowercased, Chinese segmented with jieba.
# Then all languages together: one copy of each pair, shuffled, one sentencepiece model over both
# sides, shards. Tatoeba is never used for training (it is the mining test domain).
# Environment (all optional; see preprocess/README.md):
#   BITEXT_LOCAL   folder of en-xx*.tsv[.gz] files (column 1 English) and/or OPUS Moses files
#                  (<corpus>.en-xx.en + .xx); folders/files named tatoeba* are skipped
#   OUT_DIR        output folder (default: ./data/bilingual-LANGS)
#   DOWNLOAD_DIR   where downloads go (default: ./downloads)
#   VOCAB_SIZE (50000)  SHARD_PAIRS (1000000)  SORT_MEMORY (1G)  SEED (0)  WORKERS (all cores)
#   FORCE=1        redo every step even if its output exists
set -euo pipefail

if [[ $# -ne 1 || ! $1 =~ ^[a-z]{2,3}(-[a-z]{2,3})*$ ]]; then
    echo "usage: bash do_all.sh LANGS   (languages paired with English, joined by '-', e.g. fr-es-de)" >&2
    exit 2
fi
IFS=- read -ra langs <<< "$1"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
default_out=$PWD/data/bilingual-$1
source "$here/../common.sh"

filtered=()
for lang in "${langs[@]}"; do
    if [[ $lang == en ]]; then
        echo "error: list the languages paired with English, not en itself" >&2
        exit 2
    fi
    if [[ -n ${BITEXT_LOCAL:-} ]]; then
        src=$BITEXT_LOCAL
    else
        src=$("$py" -m paraphrastic.preprocess.download opus --lang "$lang" --downloads "$downloads")
    fi
    step filter-bitext "$src" --lang "$lang" --out "$out/filtered.$lang.tsv" "${workers[@]}"
    filtered+=("$out/filtered.$lang.tsv")
done
step dedup "${filtered[@]}" --out "$out/dedup.tsv" --memory "${SORT_MEMORY:-1G}"
step shuffle "$out/dedup.tsv" --out "$out/shuffled.tsv" --seed "${SEED:-0}"
step train-sp "$out/shuffled.tsv" --out "$out/sp.model" --vocab-size "${VOCAB_SIZE:-50000}"
step encode "$out/shuffled.tsv" --sp-model "$out/sp.model" --out "$out/shards" --shard-pairs "${SHARD_PAIRS:-1000000}"

echo "done: shards in $out/shards, sentencepiece model $out/sp.model, counts in $stats" >&2
cat "$stats"
