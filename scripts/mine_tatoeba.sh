#!/usr/bin/env bash
# Bitext mining on Tatoeba with one de+fr+es model: margin (Artetxe and Schwenk, 2019) against plain cosine.
#
#   bash scripts/mine_tatoeba.sh          (from the repo root; about 3 minutes on 2 CPU cores)
#
# 1. Train: preprocess/bilingual/do_all.sh in local mode on ${PARAPHRASTIC_DATA:-../shared/data}/train/bitext
#    for de-fr-es together (Tatoeba-Challenge skipped: same origin as the test set), one 32k sentencepiece
#    vocabulary, then train.py --mode bitext with the bilingual models' settings (dim 300, batch 128, M 20,
#    lr 0.01, 3000 updates), best.pt chosen on STS 2017 en-en + STS Benchmark dev.
# 2. Sets (scripts/mine_tatoeba.py prepare): xx side = source, English side shuffled = target, for deu fra spa;
#    "test" (LASER Tatoeba, every source has its translation) and "test-half" (only 500 of the 1000
#    translations, plus 500 English distractors), and the same two layouts from Tatoeba-Challenge ("dev").
# 3. Mine every set with --criterion margin and cosine, max-score retrieval, k = 4, keeping every retrieved
#    pair (--threshold=-inf), so that the report can sweep thresholds.
# 4. Report (scripts/mine_tatoeba.py report): precision/recall of the gold pairs; the fixed threshold of each
#    criterion is chosen on dev only. Outputs under runs/mine-tatoeba/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
data=$(cd "${PARAPHRASTIC_DATA:-../shared/data}" && pwd)
py=${PYTHON:-python}
threads=${THREADS:-1}
out=runs/mine-tatoeba

if [[ ! -f $out/model/best.pt ]]; then
    echo "== preprocess de-fr-es" >&2
    (cd preprocess/bilingual && BITEXT_LOCAL="$data/train/bitext" OUT_DIR="$root/$out/data" VOCAB_SIZE=32000 \
        WORKERS=$threads PYTHON=$py bash do_all.sh de-fr-es > /dev/null)
    echo "== train" >&2
    rm -rf "$out/model"
    "$py" train.py --train-shards "$out/data/shards" --sp-model "$out/data/sp.model" --mode bitext \
        --output-dir "$out/model" --dim 300 --batch-size 128 --megabatch-size 20 --megabatch-anneal 0 \
        --lr 0.01 --max-steps 3000 --epochs 1000 --seed 0 --threads "$threads" --save-every 500 --log-every 500 \
        --dev-file "$data/sts/2017/en-en.tsv" "$data/sts/en/stsb/dev.tsv" 2> "$out/train.log"
fi

echo "== prepare the mining sets" >&2
"$py" scripts/mine_tatoeba.py prepare "$data" "$out/sets"

echo "== mine" >&2
for set in dev dev-half test test-half; do
    for lang in deu fra spa; do
        for criterion in margin cosine; do
            "$py" mine_bitext.py --source "$out/sets/$set/$lang.src" --target "$out/sets/$set/$lang.tgt" \
                --load-file "$out/model/best.pt" --output-file "$out/sets/$set/$lang.$criterion.tsv" \
                --criterion "$criterion" --threshold=-inf --k 4 --retrieval max-score --threads "$threads" --quiet
        done
    done
done

echo "== report" >&2
"$py" scripts/mine_tatoeba.py report "$out/sets" --json "$out/report.json" | tee "$out/report.md"
