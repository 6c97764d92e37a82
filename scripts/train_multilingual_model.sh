#!/usr/bin/env bash
# Train the shipped multilingual model (data/models/multilingual.pt: English, Arabic, German, Spanish, French,
# Russian, Turkish, Chinese in one space) from ../shared/data, distilled from multilingual USE v3.
# Resumable: a rerun skips the steps whose output exists (teacher vectors are cached by content under
# $PARAPHRASTIC_CACHE, default ~/.cache/paraphrastic). Each step prints its time.
#   1. text: monolingual sentences per language, bitext with English, 300 held-apart pairs per language (dev),
#      100,000 English Wikipedia sentences (scripts/multilingual_text.py) of the LANGS (the seven above; LANGS="ar de
#      es fr ru tr zh ja" adds Japanese, which has bitext only): the bitext is every file but the WMT systems' outputs
#      (WMT=1 adds them, WMT="ja" those of the languages named, WMT_MAX=N at most N a language) and
#      Tatoeba-Challenge's, to which the Tatoeba-Challenge bitext is added
#      (CHALLENGE=1, the default; CHALLENGE=0 leaves it out, as the model before did) less every pair with a side
#      near a sentence of the Tatoeba test set, and 300 more held-apart pairs per language cut from it (a dev set
#      of Tatoeba's register);
#   2. a 120,000-piece (VOCAB) unigram sentencepiece model on all of it, lowercased, raw Chinese, character coverage
#      0.9999 (at 0.9995, 39% of the Chinese sentences held a character it read as unknown; at 0.9999, 11%);
#   3. USE vectors of every sentence and every piece (scripts/multilingual_targets.py); each sentence's target is
#      the teacher's vector of itself, except that both sides of a bitext pair get the vector of the English side;
#      PCA to 300 fitted on 200,000 targets; the table = PCA'd piece vectors x a / (a + p(piece)), a = 1e-3; the
#      Arabic sentences (monolingual and bitext) are taught twice over (REPEAT=ar=2): the language whose figures lag;
#      SECOND=ar (a probe, not the shipped recipe) mixes the Arabic monolingual sentences' targets: USE's vector and
#      multilingual-e5-small's mapped into USE's space (e5's share SECOND_WEIGHT=0.5; e5: ~40 sentences/s on 2 cores);
#   4. SPANS (30,000) spans of 3-10 words of the Arabic monolingual text, each with USE's and multilingual-e5-small's
#      vectors side by side (scripts/multilingual_relate.py): a second teacher's view of short Arabic text;
#   5. paraphrastic-train: the paper's margin loss on the bitext pairs (bitext mode, hardest negatives from
#      mega-batches of MEGABATCH (4) x 128 pairs) plus distillation (1 - cos toward the target, 512 sentences an update) plus
#      80 x the relational loss (the batch's cosine matrix toward the teacher's) plus RELATE x the relational loss
#      on 512 of the spans of step 4 toward the two teachers' mean cosines; lr 0.001, STEPS updates; SEEDS (4)
#      times, with seeds 1, 2, ... (the data order);
#   6. the mean of the SEEDS tables, then every row minus the mean vector of 100,000 training sentences
#      (scripts/center_model.py --powers 0: centred, not whitened), stored in PRECISION (int8: one bfloat16 scale
#      per row, so that 120,000 rows of 300 fit 40 MiB; the previous model had 64,000 in float16); then the dev figures
#      (scripts/multilingual_dev.py) and the test figures.
# MODEL_OUT (data/models/multilingual.pt) is where the model goes.
# Needs `pip install -e .[multilingual]`. Usage: bash scripts/train_multilingual_model.sh [OUT_DIR (runs/multilingual)]
set -euo pipefail
cd "$(dirname "$0")/.."
data=${PARAPHRASTIC_DATA:-../shared/data}
out=${1:-runs/multilingual}
vocab=${VOCAB:-120000} dim=${DIM:-300} steps=${STEPS:-4000} seeds=${SEEDS:-4} relate=${RELATE:-5} repeat=${REPEAT:-ar=2} megabatch=${MEGABATCH:-4}
langs=${LANGS:-ar de es fr ru tr zh} wmt=${WMT:-0} challenge=${CHALLENGE:-1} spans=${SPANS:-30000} second=${SECOND:-} second_weight=${SECOND_WEIGHT:-0.5} precision=${PRECISION:-int8}
model=${MODEL_OUT:-data/models/multilingual.pt}
mkdir -p "$out"
step() {  # STOP_AFTER=NAME ends the recipe after that step (the tests run its first steps on a sample)
  local name=$1; shift; local t0=$SECONDS; echo "== $name" >&2; "$@"; echo "== $name: $((SECONDS - t0)) s" >&2
  [ "${STOP_AFTER:-}" != "$name" ] || exit 0
}

wmt_args=; [ "$wmt" = 0 ] || wmt_args="--wmt $([ "$wmt" = 1 ] || echo "$wmt") ${WMT_MAX:+--max-wmt $WMT_MAX}"
[ -f "$out/en.txt" ] || step text python scripts/multilingual_text.py "$data" "$out" --langs $langs $wmt_args \
  $([ "$challenge" = 0 ] || echo --challenge)
if [ ! -f "$out/distill.txt" ]; then  # monolingual, then both sides of each bitext pair, then English
  step distill-text bash -c "{ cat '$out'/mono.*.txt && cut -f2 '$out/bitext.tsv' && cut -f1 '$out/bitext.tsv' && cat '$out/en.txt'; } > '$out/distill.tmp' && mv '$out/distill.tmp' '$out/distill.txt'"
fi
cat "$data"/sts/en/2012-train/*.tsv > "$out/sts12-train.tsv"
[ -f "$out/sp.model" ] || step sentencepiece python - "$out" "$vocab" <<'PY'
import sys
from pathlib import Path
from paraphrastic.pieces import train_sentencepiece
out, vocab = Path(sys.argv[1]), int(sys.argv[2])
(out / "lower.txt").write_text((out / "distill.txt").read_text(encoding="utf-8").lower(), encoding="utf-8")
(out / "sp.tmp").write_bytes(train_sentencepiece(out / "lower.txt", vocab, character_coverage=0.9999))
(out / "sp.tmp").rename(out / "sp.model")
PY
[ -f "$out/targets.txt" ] || step teacher python scripts/multilingual_targets.py "$out" "$out" --dim "$dim" --repeat $repeat \
  --second-teacher $second --second-weight "$second_weight"
[ -f "$out/relate.npy" ] || step relate python scripts/multilingual_relate.py "$out" "$out" --langs ar --spans "$spans"
[ -f "$out/pairs.tsv" ] || { cut -f1,2 "$out/bitext.tsv" > "$out/pairs.tmp" && mv "$out/pairs.tmp" "$out/pairs.tsv"; }
models=()
for seed in $(seq 1 "$seeds"); do  # the same run with different seeds (data order), averaged by center_model.py
  run="$out/train/seed$seed"
  models+=("$run/model.pt")
  [ -f "$run/done" ] || step "train (seed $seed of $seeds)" bash -c "
    resume=; [ -f '$run/resume.pt' ] && resume=--resume
    paraphrastic-train --init-from '$out/init.pt' --output-dir '$run' \$resume --seed $seed \
      --train-file '$out/pairs.tsv' --mode bitext --margin-weight 1 --megabatch-size $megabatch \
      --distill '$out/targets.txt' '$out/targets.npy' --distill-batch-size 512 --distill-relational 80 \
      --relate '$out/relate.txt' '$out/relate.npy' --relate-weight $relate \
      --lr 0.001 --max-steps $steps --save-every 1000 && touch '$run/done'"
done
languages=$(printf ', "%s"' $langs)
step center python scripts/center_model.py "${models[@]}" "$out/distill.txt" "$model" --powers 0 \
  --precision "$precision" \
  --dev-file "$data/sts/2017/en-en.tsv" "$data/sts/en/stsb/dev.tsv" "$out/sts12-train.tsv" \
  --config "{\"multilingual\": true, \"languages\": [\"en\"$languages]}"
step dev python scripts/multilingual_dev.py "$model" --heldout "$out" --data-dir "$data"
step evaluate paraphrastic-evaluate --load-file "$model" --tasks sts,sts17,stsb,tatoeba,pud,flores --json "$out/eval.json"
