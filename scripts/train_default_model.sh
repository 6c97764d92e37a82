#!/usr/bin/env bash
# Retrain the shipped English default model (data/models/default.pt) from ../shared/data. Resumable: a rerun skips
# the steps whose output exists (teacher vectors are cached by content under $PARAPHRASTIC_CACHE, default
# ~/.cache/paraphrastic). Each step prints its time.
#   1. the distillation text: the distinct English sentences of the training data (captions, ASSET, English sides of
#      the bitext without Tatoeba-Challenge; no STS-family text), then the 1.16M Wikipedia sentences of train/en_text;
#   2. an 80,000-piece (VOCAB) unigram sentencepiece model on that text, lowercased, every ASCII letter, digit and
#      punctuation mark a piece (before, the letters j, q, z, the digits 4, 6, 7 and "?", "%", "!" were unknown: too
#      rare for character coverage 0.995), folding accents, curly quotes and dashes to ASCII ("café" reads as "cafe");
#   3. two teachers' vectors of every piece and of the first LABELLED sentences (360,000: the training data's own
#      268,011 and the first 91,989 Wikipedia ones), then of the first WMT (0: none) English sentences of the WMT
#      systems' outputs (scripts/english_sentences.py --wmt: their paraphrase groups and bitext in a seeded order,
#      the held-apart 2023 test sets never): all-MiniLM-L6-v2 and multilingual USE v3, each scaled to unit
#      length and set side by side (teacher.encode_teachers); the slow step (the model card gives its time);
#      PCA to DIM (256) fitted on those sentence vectors; the table = PCA'd piece vectors x a / (a + p(piece)),
#      a = 1e-3;
#   4. word-level targets: each word seen 3 times or more in the LABELLED sentences (about 53,000), with all-MiniLM-L6-v2's
#      mean contextual output for it (teacher.contextual_word_vectors; cached by content like the sentence vectors);
#   5. paraphrastic-train: 1 - cos toward the PCA'd teacher vector, plus CONTRASTIVE (20) x an
#      in-batch InfoNCE loss (each sentence nearest its own target among the batch's, temperature 0.1; CONTRASTIVE=0
#      turns it off), plus RELATE (30) x the relational loss on batches of words (their cosines as the word-level
#      targets'; RELATE=0 turns it off), 512 sentences per update: 128 drawn in order, each followed by its
#      NEIGHBOURS (3) nearest sentences by the teachers' targets among 4,096 drawn at random (hard negatives for the
#      contrastive term, whose labels are the teachers' own distribution over the batch at temperature SOFT, 0.05;
#      NEIGHBOURS=0 SOFT=0 give random batches and one-hot labels), lr 0.001, 6000 updates; best.pt chosen every 500
#      on the mean of STS 2017 en-en, STS Benchmark dev and STS 2012 train; NESTED="64 128" adds every loss on the
#      vectors' first 64 and 128 values too (--nested-dims); plus MARGIN (1) x the paper's margin loss on the WMT
#      systems' paraphrase pairs (139,817 of the pairs file's, none with a held-apart sentence:
#      wmt.training_pairs), hardest negatives from MEGABATCH (10) batches of 128 (WMT_GROUPS=1: never a sentence of the
#      anchor's own group; the dev sets tie, so the shipped model has copies alone kept out) (MARGIN=0: none; the recipe then
#      reads the caption pairs and teaches nothing from them, as the default before it did);
#   6. every row centred on 100,000 training sentences and whitened by the power the same dev sets choose, then
#      weighted by SIF / (SIF + p(piece)) (0.03; p counted on the distillation text; SIF=0: not weighted)
#      (scripts/center_model.py), stored in PRECISION (int8: one bfloat16 scale per row, so that 80,000 rows fit
#      25 MiB; 48,000 pieces at float16 made the previous default). DIM=512 VOCAB=48000 makes the wider model the
#      model card describes (the same dev gain as more pieces, but 15% slower in small batches).
# TEACHERS=a,b picks other teachers (default all-MiniLM-L6-v2,use-multilingual-v3; all-mpnet-base-v2 needs .[mpnet]);
# WEIGHTS=1,0.8 scales each teacher's unit vector before the PCA (default 1 each: their cosines count alike).
# DEVICE=cuda runs the sentence-transformers teachers (MiniLM, mpnet: bf16 autocast) and the training on a GPU; the
# USE and e5 packages are CPU engines and stay there.
# MODEL_OUT (data/models/default.pt) is where the model goes; STOP_AFTER=STEP ends the recipe after that step.
# Needs `pip install -e .[teacher,multilingual]`. Usage: bash scripts/train_default_model.sh [OUT_DIR (runs/default)]
set -euo pipefail
cd "$(dirname "$0")/.."
data=${PARAPHRASTIC_DATA:-../shared/data}
out=${1:-runs/default}
wmt=${WMT:-0} margin=${MARGIN:-1} megabatch=${MEGABATCH:-10} groups=${WMT_GROUPS:-0} sif=${SIF:-0.03} model=${MODEL_OUT:-data/models/default.pt} nested=${NESTED:-}
vocab=${VOCAB:-80000} dim=${DIM:-256} precision=${PRECISION:-int8} labelled=${LABELLED:-360000} contrastive=${CONTRASTIVE:-20} relate=${RELATE:-30} neighbours=${NEIGHBOURS:-3} soft=${SOFT:-0.05} teachers=${TEACHERS:-all-MiniLM-L6-v2,use-multilingual-v3} weights=${WEIGHTS:-} device=${DEVICE:-cpu}
if [ -n "$weights" ] && { ! [[ "$weights" =~ ^[0-9.]+(,[0-9.]+)*$ ]] || [ "$(tr -cd , <<< "$weights")" != "$(tr -cd , <<< "$teachers")" ]; }; then
  echo "error: WEIGHTS=$weights: give one number per teacher of TEACHERS ($teachers), comma-separated" >&2; exit 2
fi
mkdir -p "$out"
step() {  # STOP_AFTER=NAME ends the recipe after that step (the tests run its first steps on a sample)
  local name=$1; shift; local t0=$SECONDS; echo "== $name" >&2; "$@"; echo "== $name: $((SECONDS - t0)) s" >&2
  [ "${STOP_AFTER:-}" != "$name" ] || exit 0
}

if [ ! -f "$out/distill.txt" ]; then
  step sentences bash -c "{ python scripts/english_sentences.py '$data' && zcat '$data'/train/en_text/enwiki_early_articles.txt.gz '$data'/train/en_text/enwiki_2018_articles.txt.gz; } > '$out/distill.tmp' && mv '$out/distill.tmp' '$out/distill.txt'"
fi
cat "$data"/sts/en/2012-train/*.tsv > "$out/sts12-train.tsv"
dev=("$data/sts/2017/en-en.tsv" "$data/sts/en/stsb/dev.tsv" "$out/sts12-train.tsv")
[ -f "$out/sp.model" ] || step sentencepiece python - "$out" "$vocab" <<'PY'
import sys
from pathlib import Path
from paraphrastic.pieces import train_sentencepiece
out, vocab = Path(sys.argv[1]), int(sys.argv[2])
(out / "lower.txt").write_text((out / "distill.txt").read_text(encoding="utf-8").lower(), encoding="utf-8")
(out / "sp.tmp").write_bytes(train_sentencepiece(out / "lower.txt", vocab, folding=True))
(out / "sp.tmp").rename(out / "sp.model")
PY
if [ "$wmt" != 0 ] && [ ! -f "$out/wmt.txt" ]; then
  step wmt-sentences bash -c "python scripts/english_sentences.py '$data' --wmt > '$out/wmt.tmp' && mv '$out/wmt.tmp' '$out/wmt.txt'"
fi
pairs="$data/train/en_paraphrase/multi30k_task2_en_captions.pairs.tsv.gz"  # read, not taught, at MARGIN=0
if [ "$margin" != 0 ]; then
  pairs="$out/wmt-pairs.tsv"; [ "$groups" = 0 ] || pairs="$out/wmt-pairs-groups.tsv"
  [ -f "$pairs" ] || step wmt-pairs python - "$data" "$pairs" "$groups" <<'PY'
import sys
from pathlib import Path
from paraphrastic.fileio import atomic_output
from paraphrastic.preprocess.wmt import training_pairs
columns = 2 if sys.argv[3] == "0" else 3  # sentence, sentence(, its group)
with atomic_output(sys.argv[2], "w") as f:
    f.writelines("\t".join(pair[:columns]) + "\n" for pair in training_pairs(Path(sys.argv[1])))
PY
fi
{ head -n "$labelled" "$out/distill.txt"; [ "$wmt" = 0 ] || head -n "$wmt" "$out/wmt.txt"; } > "$out/labelled.txt"  # targets.npy's rows
[ -f "$out/targets.npy" ] || step teacher python - "$out" "$dim" "$teachers" "$device" "$weights" <<'PY'
import sys
from pathlib import Path
import numpy as np, torch
from paraphrastic.fileio import read_lines
from paraphrastic.models import SPModel, Tokenizer
from paraphrastic.teacher import encode_teachers, fit_pca, initial_table, load_teacher, piece_probabilities, piece_texts, save_npy
out, dim = Path(sys.argv[1]), int(sys.argv[2])
tokenizer = Tokenizer((out / "sp.model").read_bytes(), lowercase=True)
teachers = {name: load_teacher(name, sys.argv[4]) for name in sys.argv[3].split(",")}
weights = dict(zip(teachers, map(float, sys.argv[5].split(",")), strict=True)) if sys.argv[5] else None
pieces = encode_teachers(teachers, piece_texts(tokenizer), weights=weights)
raw = encode_teachers(teachers, read_lines(out / "labelled.txt"), weights=weights)
sample = np.random.default_rng(0).choice(len(raw), min(200_000, len(raw)), replace=False)
pca = fit_pca(raw[sample], dim)
table = initial_table(pieces, piece_probabilities(tokenizer, out / "distill.txt"), pca, 1e-3)
config = {"source": "teacher.py", "teacher": " + ".join(teachers), "sif_a": 1e-3} | ({"weights": weights} if weights else {})
SPModel(tokenizer, torch.from_numpy(table), config).save(out / "init.pt")
targets = np.concatenate([(raw[i : i + 100_000] - pca[0]) @ pca[1] for i in range(0, len(raw), 100_000)])
save_npy(out / "targets.npy", targets.astype(np.float16))
PY
relate_args=
if [ "$relate" != 0 ]; then
  relate_args="--relate '$out/words.txt' '$out/words.npy' --relate-weight $relate"
  [ -f "$out/words.npy" ] || step words python - "$out" "$device" "$labelled" <<'PY'
import sys
from pathlib import Path
from paraphrastic.fileio import atomic_path, read_lines
from paraphrastic.teacher import DEFAULT_TEACHER, contextual_word_vectors, load_teacher, save_npy
out = Path(sys.argv[1])
teacher = load_teacher(DEFAULT_TEACHER, sys.argv[2])
sentences = read_lines(out / "distill.txt")[: int(sys.argv[3])]  # the LABELLED sentences, without the WMT ones
words, vectors = contextual_word_vectors(teacher, DEFAULT_TEACHER, sentences)
with atomic_path(out / "words.txt") as tmp:
    tmp.write_text("\n".join(words) + "\n", encoding="utf-8")
save_npy(out / "words.npy", vectors)  # last: its presence means the step is done
PY
fi
[ -f "$out/train/best.pt" ] && [ ! -f "$out/train/resume.pt" -o -f "$out/train/done" ] || step train bash -c "
  resume=; [ -f '$out/train/resume.pt' ] && resume=--resume
  paraphrastic-train --init-from '$out/init.pt' --output-dir '$out/train' \$resume --device $device \
    --train-file '$pairs' --margin-weight $margin --megabatch-size $megabatch \
    --distill '$out/labelled.txt' '$out/targets.npy' --distill-batch-size 512 \
    --distill-contrastive $contrastive --distill-temperature 0.1 --distill-neighbours $neighbours --distill-soft $soft \
    $relate_args ${nested:+--nested-dims $nested} \
    --lr 0.001 --max-steps 6000 --save-every 500 --dev-file $(printf "'%s' " "${dev[@]}")&& touch '$out/train/done'"
sif_args=; [ "$sif" = 0 ] || sif_args="--sif-a $sif"
step center python scripts/center_model.py "$out/train/best.pt" "$out/distill.txt" "$model" --precision "$precision" --dev-file "${dev[@]}" $sif_args
step evaluate paraphrastic-evaluate --load-file "$model" --tasks sts,sts17,stsb,sick --json "$out/eval.json"
