#!/usr/bin/env bash
# GRAN against SP, and the back-translation paper's pair filters (issue 21), on the same data and budget as
# scripts/compare_encoders.sh: 50,000 English caption pairs (its seeded sample), one epoch of 128-pair
# updates, M = 1, dim 300, 8,000 pieces, lr 0.01 (SP) or 0.001 (GRAN, as the LSTMs); best.pt chosen on
# STS 2017 en-en. Each filter is tried once at the setting below on SP; the filter is chosen by the dev
# mean (STS 2017 en-en and STS Benchmark dev), and GRAN is trained without it and with the chosen one.
# STS 2012-2016 is reported, never chosen by. Writes runs/gran/<variant>-<encoder>/ and runs/gran/table.md.
#
#   bash scripts/gran_and_filters.sh            (from the repo root; about 25 minutes on 2 cores)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
data=$(cd "${PARAPHRASTIC_DATA:-../shared/data}" && pwd)
out=runs/gran
threads=${THREADS:-$(nproc)}
mkdir -p "$out" runs/compare

pairs=runs/compare/captions50k.tsv  # the sample compare_encoders.sh trains on
if [ ! -f "$pairs" ]; then
  python scripts/caption_sample.py "$data/train/en_paraphrase/multi30k_task2_en_captions.pairs.tsv.gz" "$pairs"
fi
reference="$out/wiki100k.txt"  # the language model's reference text: 100k English Wikipedia sentences
if [ ! -f "$reference" ]; then  # head closes the pipe early, which zcat reports: not an error here
  zcat "$data/train/en_text/enwiki_2018_articles.txt.gz" | head -n 100000 >"$reference" || true
fi

# variant and its filter-pairs flags (bounds: the paper's where it gives them, else a quartile of this data)
variants=(
  "none|--length 0 1000000"
  "length|--length 0 10"
  "overlap1|--length 0 1000000 --overlap 1 --overlap-range 0 0.7"
  "bleu|--length 0 1000000 --bleu 0.1 1"
  "perplexity|--length 0 1000000 --lm-text $reference --max-perplexity 1554"
)

train() {  # variant, encoder, lr
  local run="$out/$1-$2"
  [ -f "$run/eval.json" ] && return
  rm -rf "$run"
  paraphrastic-train --train-file "$out/$1.tsv" --output-dir "$run" --model "$2" --dim 300 --vocab-size 8000 \
    --epochs 1 --batch-size 128 --megabatch-size 1 --lr "$3" --save-every 25 --log-every 25 --threads "$threads" \
    --dev-file "$data/sts/2017/en-en.tsv" 2>"$run.log" || { tail -3 "$run.log"; exit 1; }
  paraphrastic-evaluate --load-file "$run/best.pt" --data-dir "$data" --tasks sts,stsb --json "$run/eval.json" >/dev/null
}

for spec in "${variants[@]}"; do
  name=${spec%%|*}
  # shellcheck disable=SC2086
  [ -f "$out/$name.tsv" ] || python -m paraphrastic.preprocess.steps filter-pairs "$pairs" --out "$out/$name.tsv" \
    --stats "$out/$name.stats.json" ${spec#*|}
  train "$name" sp 0.01
done

best=$(python - "$out" <<'PY'
import json, sys
from pathlib import Path
import torch
out = Path(sys.argv[1])
def dev(run):
    sts17 = torch.load(run / "best.pt", weights_only=True)["config"]["dev_pearson"]["en-en.tsv"]
    stsb = json.loads((run / "eval.json").read_text())["stsb"]["sets"]["dev"]["pearson"]
    return (sts17 + stsb) / 2
print(max(["length", "overlap1", "bleu", "perplexity", "none"], key=lambda v: dev(out / f"{v}-sp")))
PY
)
echo "filter chosen on the dev sets: $best"
train none gran 0.001
[ "$best" = none ] || train "$best" gran 0.001

python - "$out" "$best" <<'PY'
import json, sys
from pathlib import Path
import torch
out, best = Path(sys.argv[1]), sys.argv[2]
rows = ["| encoder | pairs (filter) | kept | 2012 | 2013 | 2014 | 2015 | 2016 | STS12-16 | STSb dev | STS17 en-en | dev mean |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
for run in sorted(out.glob("*-sp")) + sorted(out.glob("*-gran")):
    if not (run / "eval.json").exists():
        continue
    variant, encoder = run.name.rsplit("-", 1)
    r = json.loads((run / "eval.json").read_text())
    years = r["sts"]["years"]
    sts17 = torch.load(run / "best.pt", weights_only=True)["config"]["dev_pearson"]["en-en.tsv"]
    stsb = r["stsb"]["sets"]["dev"]["pearson"]
    row = [encoder, variant + (" (chosen)" if variant == best else ""), "",
           *[f"{years[y]['pearson']:.1f}" for y in ("2012", "2013", "2014", "2015", "2016")],
           f"{r['sts']['avg']['pearson']:.1f}", f"{stsb:.1f}", f"{sts17:.1f}", f"{(sts17 + stsb) / 2:.1f}"]
    row[2] = str(sum(1 for _ in open(out / f"{variant}.tsv")))
    rows.append("| " + " | ".join(row) + " |")
(out / "table.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
docs = Path("docs/training.md")  # the table between the gran markers, as generated
text = docs.read_text()
head, rest = text.split("<!-- gran:start -->\n", 1)
docs.write_text(head + "<!-- gran:start -->\n" + "\n".join(rows) + "\n" + rest[rest.index("<!-- gran:end -->"):])
PY
