"""The work of paraphrastic-evaluate (its options: options.evaluate_args): a model evaluated on STS 2012-2016,
STS 2017, STS Benchmark, SICK-R and Tatoeba, as in the paper, and on PUD and FLORES retrieval.

    paraphrastic-evaluate --load-file model.pt --tasks sts,sts17,stsb,sick,tatoeba,pud,flores [--compare]

Protocols (Wieting et al., "Paraphrastic Representations at Scale"): the score of a pair is the cosine
of the two sentence embeddings. STS 2012-2016 (Table 2): Pearson r x 100 per dataset, the mean over the
datasets of each year, and "Avg." = the mean of the five year means; the later protocol, Spearman rho
over the concatenation of each year's datasets, is reported beside it. STS 2017 (Table 3), STS
Benchmark and SICK-R: Pearson and Spearman x 100. Tatoeba (Table 4): nearest neighbour by cosine in
both directions, error rate x 100 per direction and their mean (LASER's index-based protocol); PUD and
FLORES-200 devtest the same way, for the seven languages of the multilingual model.

Data is read from `--data-dir` ($PARAPHRASTIC_DATA, else ../shared/data beside a checkout, else
~/.cache/paraphrastic/data, where `python -m paraphrastic.preprocess.evaluation.download` puts it) in either the
`score<TAB>s1<TAB>s2` TSV layout or the organisers' raw files (STS.input.*.txt + STS.gs.*.txt,
STS Benchmark sts-*.csv, SICK_*.txt, tatoeba.xxx-eng.xxx). Pairs without a gold score are dropped;
missing sets are reported and skipped unless --require-all (or an explicit --langs list) asks for them, and a
folder holding none of the chosen sets is an error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraphrastic import knn, static, workers
from paraphrastic.cli import run_cli
from paraphrastic.fileio import InputError, atomic_output, read_lines, refuse_same_file
from paraphrastic.options import DEFAULT_LANGS
from paraphrastic.options import evaluate_args as parse_args

ROOT = Path(__file__).resolve().parent
RETRIEVAL = ("tatoeba", "pud", "flores")
FETCH = (
    "fetch the sets into it with `python -m paraphrastic.preprocess.evaluation.download`, or pass --data-dir, "
    "or set PARAPHRASTIC_DATA"
)

STS_YEARS = {
    "2012": ["MSRpar", "MSRvid", "SMTeuroparl", "OnWN", "SMTnews"],
    "2013": ["FNWN", "headlines", "OnWN", "SMT"],
    "2014": ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"],
    "2015": ["answers-forums", "answers-students", "belief", "headlines", "images"],
    "2016": ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"],
}
RAW_STS_NAMES = {("2012", "OnWN"): "surprise.OnWN", ("2012", "SMTnews"): "surprise.SMTnews"}
NOT_DISTRIBUTED = {"2013/SMT": "not distributed (LDC licence): the 2013 mean is over the other 3 sets, as in the paper"}
STS17_TRACKS = {
    "ar-ar": "track1.ar-ar",
    "ar-en": "track2.ar-en",
    "es-es": "track3.es-es",
    "es-en": "track4a.es-en",
    "tr-en": "track6.tr-en",
    "en-en": "track5.en-en",
    "es-en-wmt": "track4b.es-en",
}
STSB_SPLITS = {"dev": "dev", "test": "test"}
SICK_SPLITS = {"trial": "trial", "test": "test_annotated"}
PUD_CODES = {"cmn": "zho"}  # PUD's Chinese (traditional characters) is named zho
FLORES_CODES = {  # Tatoeba's language codes -> FLORES-200 file names (Chinese: simplified)
    **{c: f"{c}_Latn" for c in ("deu", "spa", "fra", "tur")},
    "ara": "arb_Arab",
    "rus": "rus_Cyrl",
    "cmn": "zho_Hans",
}
FAISS_MIN_KEYS = 100_000  # exact search in torch below this many sentences a side; faiss (when installed) above

PAPER_SP = {  # the paper's published figures for the SP model
    "sts": {"2012": 68.7, "2013": 64.7, "2014": 78.1, "2015": 81.4, "2016": 80.0, "avg": 74.6},
    "sts17": {"ar-ar": 76.2, "ar-en": 78.3, "es-es": 85.8, "es-en": 78.4, "tr-en": 79.2},
    "tatoeba": {"ara": 8.8, "deu": 1.5, "spa": 2.4, "fra": 5.4, "rus": 5.6, "tur": 1.4},
}
MULTILINGUAL_NOTE = (
    "the paper's figures are of an English SP model and of one bilingual model per language, not of one model "
    "for many languages, so --compare does not print them beside this multilingual model; its model card "
    "(data/models/README.md) sets them side by side with that caveat"
)


# ----------------------------------------------------------------------------- reading pairs


@dataclass
class Pairs:
    """The scored pairs of one STS set."""

    s1: list[str]
    s2: list[str]
    gold: np.ndarray


def parse_score(text: str, path: Path, line_no: int) -> float | None:
    """A gold score, or None when the field is empty (the organisers' mark for an unscored pair)."""
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{path}:{line_no}: gold score {text[:30]!r} is not a number") from None


def make_pairs(rows: list[tuple[float | None, str, str]]) -> Pairs:
    """Keep the rows that have a gold score."""
    rows = [r for r in rows if r[0] is not None]
    return Pairs([r[1] for r in rows], [r[2] for r in rows], np.array([r[0] for r in rows], dtype=np.float64))


def columns(line: str, path: Path, line_no: int, at_least: int) -> list[str]:
    """Tab-separated fields of a line, which must have at least `at_least` of them."""
    fields = line.split("\t")
    if len(fields) < at_least:
        raise InputError(f"{path}:{line_no}: expected at least {at_least} tab-separated fields, found {len(fields)}")
    return fields


def read_tsv(path: Path) -> Pairs:
    """The `score<TAB>s1<TAB>s2` layout of ../shared/data."""
    rows = []
    for i, line in enumerate(read_lines(path, strict=True), 1):
        fields = line.split("\t")
        if len(fields) != 3:
            raise InputError(f"{path}:{i}: expected score<TAB>sentence1<TAB>sentence2, found {len(fields)} fields")
        rows.append((parse_score(fields[0], path, i), fields[1], fields[2]))
    return make_pairs(rows)


def gold_file_of(path: Path) -> Path | None:
    """The STS.gs.* file matching an STS.input.* file: beside it, or in a sibling folder (STS 2017)."""
    name = path.name.replace(".input.", ".gs.", 1)
    for candidate in [path.with_name(name), *sorted(path.parent.parent.glob(f"*/{name}"))]:
        if candidate.is_file():
            return candidate
    return None


def read_raw_sts(path: Path) -> Pairs:
    """Organisers' STS.input.X.txt (s1<TAB>s2[<TAB>...]) with STS.gs.X.txt, line by line.

    Inputs beyond the end of the gold file have no score and are dropped (STS 2017 tr-en). Without a
    gold file, a third column holds the score (the merged layout of the original toolkit's STS 2017).
    """
    lines = read_lines(path, strict=True)
    gold_path = gold_file_of(path)
    if gold_path is None:
        rows = [columns(line, path, i, 3) for i, line in enumerate(lines, 1)]
        return make_pairs([(parse_score(r[2], path, i), r[0], r[1]) for i, r in enumerate(rows, 1)])
    gold = read_lines(gold_path, strict=True)
    if len(gold) > len(lines):
        raise InputError(f"{gold_path}: {len(gold)} gold scores for {len(lines)} input lines in {path}")
    rows = []
    for i, (line, score) in enumerate(zip(lines, gold, strict=False), 1):
        fields = columns(line, path, i, 2)
        rows.append((parse_score(score.split("\t")[0], gold_path, i), fields[0], fields[1]))
    return make_pairs(rows)


def read_stsb_csv(path: Path) -> Pairs:
    """STS Benchmark sts-*.csv: genre, file, year, id, score, s1, s2[, sources] separated by tabs."""
    rows = []
    for i, line in enumerate(read_lines(path, strict=True), 1):
        fields = columns(line, path, i, 7)
        rows.append((parse_score(fields[4], path, i), fields[5], fields[6]))
    return make_pairs(rows)


def read_sick(path: Path) -> Pairs:
    """SICK_*.txt: a header line naming sentence_A, sentence_B and relatedness_score."""
    lines = read_lines(path, strict=True)
    header = lines[0].split("\t") if lines else []
    if not {"sentence_A", "sentence_B", "relatedness_score"} <= set(header):
        raise InputError(f"{path}:1: not a SICK file (no sentence_A / sentence_B / relatedness_score header)")
    a, b, s = (header.index(k) for k in ("sentence_A", "sentence_B", "relatedness_score"))
    rows = []
    for i, line in enumerate(lines[1:], 2):
        fields = columns(line, path, i, len(header))
        rows.append((parse_score(fields[s], path, i), fields[a], fields[b]))
    return make_pairs(rows)


def read_sts_pairs(path: str | os.PathLike) -> Pairs:
    """Read an STS-style set in any supported layout, chosen by the file name."""
    path = Path(path)
    if ".input." in path.name:
        return read_raw_sts(path)
    if path.suffix == ".csv":
        return read_stsb_csv(path)
    if path.name.startswith("SICK"):
        return read_sick(path)
    return read_tsv(path)


# ----------------------------------------------------------------------------- finding sets


def locate(root: Path, patterns: list[str]) -> Path | None:
    """The first file under `root` matching one of the glob patterns, in order."""
    for pattern in patterns:
        hits = sorted(p for p in root.glob(pattern) if p.is_file())
        if hits:
            return hits[0]
    return None


def sts_patterns(year: str, name: str) -> list[str]:
    """Where an STS 2012-2016 set may be: our TSV layout, or SentEval's STSyy-en-test raw folders."""
    raw = RAW_STS_NAMES.get((year, name), name)
    prefix = "STS2016" if year == "2016" else "STS"
    return [
        f"sts/en/{year}/{name}.tsv",
        f"sts/en/{year}/{prefix}.input.{raw}.txt",
        f"STS{year[2:]}-en-test/{prefix}.input.{raw}.txt",
        f"STS{year[2:]}-en-test/*/{prefix}.input.{raw}.txt",
    ]


def task_sets(task: str) -> dict[str, list[str]]:
    """Set key -> candidate path patterns, for one task."""
    if task == "sts":
        return {f"{y}/{n}": sts_patterns(y, n) for y, names in STS_YEARS.items() for n in names}
    if task == "sts17":
        return {
            k: [f"sts/2017/{k}.tsv", f"STS*17*/STS.input.{t}.txt", f"STS.input.{t}.txt"]
            for k, t in STS17_TRACKS.items()
        }
    if task == "stsb":
        return {
            k: [f"sts/en/stsb/{s}.tsv", f"STSBenchmark/sts-{s}.csv", f"STSBenchmark/*/sts-{s}.csv", f"sts-{s}.csv"]
            for k, s in STSB_SPLITS.items()
        }
    if task == "sick":
        return {k: [f"sts/en/sick/{k}.tsv", f"*/SICK_{s}.txt", f"SICK_{s}.txt"] for k, s in SICK_SPLITS.items()}
    raise ValueError(task)


def find_sets(root: Path, task: str) -> tuple[dict[str, Path], dict[str, str]]:
    """(found set key -> file, missing set key -> why) for one STS-style task."""
    found, missing = {}, {}
    for key, patterns in task_sets(task).items():
        path = None if key in NOT_DISTRIBUTED else locate(root, patterns)
        if path is None:
            missing[key] = NOT_DISTRIBUTED.get(key, "not found, skipped")
        else:
            found[key] = path
    return found, missing


def tatoeba_files(root: Path, lang: str) -> tuple[Path, Path] | None:
    """(xx file, eng file) of a Tatoeba language, in our layout or LASER's tatoeba.xxx-eng.xxx."""
    for folder in (root / "tatoeba", root / "tatoeba" / "v1", root):
        for stem in (f"{lang}-eng", f"tatoeba.{lang}-eng"):
            xx, eng = folder / f"{stem}.{lang}", folder / f"{stem}.eng"
            if xx.is_file() and eng.is_file():
                return xx, eng
    return None


def retrieval_files(root: Path, task: str, lang: str) -> tuple[Path, Path] | None:
    """(xx file, eng file) of a language of a retrieval task (tatoeba, pud or flores); None when absent."""
    if task == "tatoeba":
        return tatoeba_files(root, lang)
    if task == "pud":
        code = PUD_CODES.get(lang, lang)
        xx, eng = root / "pud" / f"{code}-eng.{code}", root / "pud" / f"{code}-eng.eng"
    else:
        folder = root / "flores200_devtest"
        xx, eng = folder / f"{FLORES_CODES.get(lang, lang)}.devtest", folder / "eng_Latn.devtest"
    return (xx, eng) if xx.is_file() and eng.is_file() else None


def tatoeba_langs(root: Path) -> list[str]:
    """Every language with Tatoeba files under `root` (for --langs all)."""
    langs = set()
    for folder in (root / "tatoeba", root / "tatoeba" / "v1", root):
        langs.update(p.name.removeprefix("tatoeba.").split("-eng.")[0] for p in folder.glob("*-eng.eng"))
    return sorted(langs)


# ----------------------------------------------------------------------------- scoring


def embed_unique(model, texts: list[str], batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Embed each distinct text once: (vectors of the distinct texts, row of each input text)."""
    index: dict[str, int] = {}
    rows = np.fromiter((index.setdefault(t, len(index)) for t in texts), dtype=np.int64, count=len(texts))
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    return np.asarray(model.embed_raw_text(list(index), **kwargs), dtype=np.float32), rows


def pair_cosines(model, sets: dict[str, Pairs], batch_size: int | None = None) -> dict[str, np.ndarray]:
    """Cosine of every pair of every set, embedding each distinct sentence of all the sets once."""
    texts = [t for p in sets.values() for t in (*p.s1, *p.s2)]
    vectors, rows = embed_unique(model, texts, batch_size)
    out, start = {}, 0
    for key, p in sets.items():
        n = len(p.gold)
        left, right = rows[start : start + n], rows[start + n : start + 2 * n]
        out[key] = static.cosine(vectors[left], vectors[right])
        start += 2 * n
    return out


def correlations(pred: np.ndarray, gold: np.ndarray) -> dict:
    """Pearson r and Spearman rho x 100 and the pair count; NaN where undefined (constant or < 2 pairs)."""
    from scipy.stats import pearsonr, spearmanr  # here: its import takes most of a second, and --help needs none

    if len(gold) < 2:
        return {"pearson": math.nan, "spearman": math.nan, "n": len(gold)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: scipy warns and returns NaN, which we report
        return {
            "pearson": 100 * float(pearsonr(pred, gold)[0]),
            "spearman": 100 * float(spearmanr(pred, gold)[0]),
            "n": len(gold),
        }


def score_sts_file(model, path: str | os.PathLike, batch_size: int | None = None) -> dict:
    """Pearson/Spearman x 100 and pair count `n` of a model on one STS file (any supported layout)."""
    pairs = read_sts_pairs(path)
    return correlations(pair_cosines(model, {"set": pairs}, batch_size)["set"], pairs.gold)


def score_sets(model, found: dict[str, Path], batch_size: int | None) -> tuple[dict[str, dict], dict[str, tuple]]:
    """Per-set correlations of one task, plus each set's (cosines, gold) for pooled statistics."""
    pairs = {key: read_sts_pairs(path) for key, path in found.items()}
    cos = pair_cosines(model, pairs, batch_size)
    return {k: correlations(cos[k], pairs[k].gold) for k in pairs}, {k: (cos[k], pairs[k].gold) for k in pairs}


def year_means(sets: dict[str, dict]) -> tuple[dict[str, dict], dict]:
    """Table 2 protocol: per-year means of the per-dataset figures, and "Avg." = mean of the year means."""
    years = {}
    for year in STS_YEARS:
        got = [m for k, m in sets.items() if k.split("/")[0] == year]
        if got:
            years[year] = {
                "pearson": float(np.mean([m["pearson"] for m in got])),
                "spearman": float(np.mean([m["spearman"] for m in got])),
                "n": sum(m["n"] for m in got),
                "sets": len(got),
            }
    avg = {k: float(np.mean([y[k] for y in years.values()])) if years else math.nan for k in ("pearson", "spearman")}
    return years, {**avg, "years": len(years)}


def pooled_spearman(scored: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The later protocol: Spearman rho x 100 over the concatenation of a year's datasets."""
    pred = np.concatenate([s[0] for s in scored])
    gold = np.concatenate([s[1] for s in scored])
    return correlations(pred, gold)["spearman"]


def evaluate_sts(model, root: Path, batch_size: int | None = None) -> dict:
    """STS 2012-2016: per dataset, per year (mean and pooled) and the average over years."""
    found, missing = find_sets(root, "sts")
    sets, scored = score_sets(model, found, batch_size)
    years, avg = year_means(sets)
    for year, summary in years.items():
        summary["spearman_all"] = pooled_spearman([v for k, v in scored.items() if k.startswith(year)])
    avg["spearman_all"] = float(np.mean([y["spearman_all"] for y in years.values()])) if years else math.nan
    return {"sets": sets, "years": years, "avg": avg, "missing": missing}


def evaluate_pair_task(model, root: Path, task: str, batch_size: int | None = None) -> dict:
    """STS 2017, STS Benchmark or SICK-R: Pearson and Spearman x 100 per set."""
    found, missing = find_sets(root, task)
    return {"sets": score_sets(model, found, batch_size)[0], "missing": missing}


# ----------------------------------------------------------------------------- tatoeba


def retrieval_errors(src: np.ndarray, tgt: np.ndarray) -> tuple[float, float]:
    """Error rate x 100 of nearest-neighbour retrieval src->tgt and tgt->src, where row i pairs with row i."""
    gold = np.arange(len(src))
    to_tgt, to_src = knn.nearest_both_ways(src, tgt, faiss_from=FAISS_MIN_KEYS)
    return 100 * float(np.mean(to_tgt != gold)), 100 * float(np.mean(to_src != gold))


def parallel_lines(xx: Path, eng: Path) -> tuple[list[str], list[str]]:
    """The two sides of a retrieval language, which must have the same number of lines."""
    left, right = read_lines(xx, strict=True), read_lines(eng, strict=True)
    if len(left) != len(right):
        raise InputError(f"{xx}: {len(left)} lines but {eng} has {len(right)}; line i must translate line i")
    return left, right


def evaluate_retrieval(model, root: Path, task: str, langs: list[str], batch_size: int | None = None) -> dict:
    """Tatoeba (Table 4), PUD or FLORES: xx->eng and eng->xx error rates x 100, their mean, and the average
    over languages."""
    results, missing = {}, {}
    for lang in langs:
        files = retrieval_files(root, task, lang)
        if files is None:
            missing[lang] = "not found, skipped"
            continue
        xx, eng = parallel_lines(*files)
        vectors, rows = embed_unique(model, xx + eng, batch_size)
        to_eng, from_eng = retrieval_errors(vectors[rows[: len(xx)]], vectors[rows[len(xx) :]])
        results[lang] = {"xx_eng": to_eng, "eng_xx": from_eng, "mean": (to_eng + from_eng) / 2, "n": len(xx)}
    avg = {k: float(np.mean([r[k] for r in results.values()])) if results else math.nan for k in ("xx_eng", "eng_xx")}
    avg["mean"] = (avg["xx_eng"] + avg["eng_xx"]) / 2
    return {"langs": results, "avg": {**avg, "langs": len(results)}, "missing": missing}


# ----------------------------------------------------------------------------- report


def fmt(x: float | None, width: int = 6) -> str:
    """A figure with one decimal, as in the paper's tables; '-' when absent or undefined."""
    return f"{'-':>{width}}" if x is None or math.isnan(x) else f"{x:{width}.1f}"


def report_sts(r: dict, compare: bool) -> list[str]:
    """Table 2 block: per-dataset lines, missing sets with the reason, then the per-year table."""
    out = ["STS 2012-2016 (Table 2): Pearson r x 100 per dataset; year = mean over its datasets; Avg. = mean of years"]
    out.append(f"  {'year':<5} {'dataset':<18} {'n':>5} {'pearson':>8} {'spearman':>9}")
    for key, m in r["sets"].items():
        year, name = key.split("/")
        out.append(f"  {year:<5} {name:<18} {m['n']:>5} {fmt(m['pearson'], 8)} {fmt(m['spearman'], 9)}")
    for key, why in r["missing"].items():
        out.append(f"  {key.replace('/', ' '):<24}    {why}")
    years = list(STS_YEARS)
    out.append(f"  {'':<16}" + "".join(f"{y:>7}" for y in years) + f"{'Avg.':>7}")
    rows = [("pearson (mean)", "pearson"), ("spearman (mean)", "spearman"), ("spearman (all)", "spearman_all")]
    for label, k in rows:
        vals = [r["years"].get(y, {}).get(k) for y in years]
        out.append(f"  {label:<16}" + "".join(fmt(v, 7) for v in vals) + fmt(r["avg"][k], 7))
    out.append(f"  {'pairs':<16}" + "".join(f"{r['years'].get(y, {}).get('n', 0):>7}" for y in years))
    if compare:
        out.append(f"  {'paper SP (r)':<16}" + "".join(fmt(PAPER_SP["sts"][y], 7) for y in years + ["avg"]))
    if r["avg"]["years"] < len(years):
        out.append(f"  note: Avg. is over {r['avg']['years']} of {len(years)} years (the others are missing)")
    return out


def report_pairs(title: str, r: dict, paper: dict | None) -> list[str]:
    """One line per set (n, Pearson, Spearman, optionally the paper's figure), then the missing sets."""
    head = f"  {'set':<10} {'n':>5} {'pearson':>8} {'spearman':>9}" + (f" {'paper SP':>9}" if paper is not None else "")
    out = [title, head]
    for key, m in r["sets"].items():
        ref = "" if paper is None else fmt(paper.get(key), 9)
        out.append(f"  {key:<10} {m['n']:>5} {fmt(m['pearson'], 8)} {fmt(m['spearman'], 9)} {ref}".rstrip())
    out += [f"  {key:<10} {why}" for key, why in r["missing"].items()]
    return out


RETRIEVAL_TITLES = {
    "tatoeba": "Tatoeba (Table 4)",
    "pud": "PUD (1,000 parallel treebank sentences a language)",
    "flores": "FLORES-200 devtest (1,012 sentences a language)",
}


def report_retrieval(task: str, r: dict, compare: bool) -> list[str]:
    """Per-language error rates, their average, then the missing languages (the paper's figures: Tatoeba)."""
    compare = compare and task == "tatoeba"
    out = [f"{RETRIEVAL_TITLES[task]}: nearest-neighbour error rate x 100 (lower is better)"]
    out.append(f"  {'lang':<6} {'n':>5} {'xx->eng':>8} {'eng->xx':>8} {'mean':>6}" + (" paper SP" if compare else ""))
    for lang, m in [*r["langs"].items(), ("avg", r["avg"])]:
        n = m.get("n", m.get("langs"))
        ref = fmt(PAPER_SP["tatoeba"].get(lang), 9) if compare else ""
        out.append(f"  {lang:<6} {n:>5} {fmt(m['xx_eng'], 8)} {fmt(m['eng_xx'], 8)} {fmt(m['mean'])}{ref}")
    out += [f"  {lang:<6} {why}" for lang, why in r["missing"].items()]
    return out


def report(results: dict, compare: bool) -> str:
    """The human-readable tables, one block per task, in the paper's layout."""
    blocks = []
    if "sts" in results:
        blocks.append(report_sts(results["sts"], compare))
    if "sts17" in results:
        title = "STS 2017 (Table 3): Pearson r x 100 (and Spearman); en-en is the dev set, es-en-wmt is extra"
        blocks.append(report_pairs(title, results["sts17"], PAPER_SP["sts17"] if compare else None))
    if "stsb" in results:
        blocks.append(report_pairs("STS Benchmark: Pearson / Spearman x 100", results["stsb"], None))
    if "sick" in results:
        blocks.append(report_pairs("SICK-R: Pearson / Spearman x 100", results["sick"], None))
    blocks += [report_retrieval(task, results[task], compare) for task in RETRIEVAL if task in results]
    return "\n\n".join("\n".join(b) for b in blocks)


def json_safe(value):
    """NaN and infinities -> null, so the JSON is standard."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ----------------------------------------------------------------------------- CLI


def evaluate(
    model, root: Path, tasks: list[str], langs: list[str], batch_size: int | None = None, strict: bool = False
) -> dict:
    """Run the chosen tasks; returns {task: results}. `strict`: a missing set is an InputError."""
    results = {}
    for task in tasks:
        if task == "sts":
            results[task] = evaluate_sts(model, root, batch_size)
        elif task in RETRIEVAL:
            task_langs = langs if task == "tatoeba" else [lang for lang in langs if lang in FLORES_CODES]
            results[task] = evaluate_retrieval(model, root, task, task_langs, batch_size)
        else:
            results[task] = evaluate_pair_task(model, root, task, batch_size)
        missing = {k: v for k, v in results[task]["missing"].items() if k not in NOT_DISTRIBUTED}
        if strict and missing:
            raise InputError(f"{root}: {task}: missing {', '.join(missing)} (drop --require-all to skip them)")
    if not any(r.get("sets") or r.get("langs") for r in results.values()):  # a wrong folder, not a partial one
        raise InputError(f"{root}: none of the sets of {','.join(tasks)} is here (expected e.g. sts/en/stsb/dev.tsv; "
                         f"{FETCH})")  # fmt: skip
    return results


def chosen_langs(root: Path, langs: str | None) -> list[str]:
    """The Tatoeba languages of --langs; a language named explicitly must have its files."""
    if langs is None:
        return DEFAULT_LANGS
    if langs == "all":
        return tatoeba_langs(root)
    chosen = [lang for lang in langs.split(",") if lang]
    absent = [lang for lang in chosen if tatoeba_files(root, lang) is None]
    if absent:
        raise InputError(f"{root}: no Tatoeba files for {','.join(absent)} (expected tatoeba/<lang>-eng.<lang> + .eng)")
    return chosen


@run_cli
def main(argv: list[str] | None = None) -> int:
    """Load the model, run the tasks, print the tables and optionally write the JSON file."""
    args = parse_args(argv)
    if not args.data_dir.is_dir():
        raise InputError(f"{args.data_dir}: no such data folder ({FETCH})")
    langs = chosen_langs(args.data_dir, args.langs)
    refuse_same_file(args.json, *map(static.model_path, args.load_file), args.sp_model, args.data_dir)
    workers.use_threads(args.threads)
    from paraphrastic import load_encoder  # here: --help and argument errors come before the model's reader

    everything = {}
    for name in args.load_file:
        model = load_encoder(name, args.sp_model, args.device)  # our SP checkpoints on the CPU: no torch
        if len(args.load_file) > 1:
            print(f"== {name or 'default'}")
        everything[name or "default"] = results = evaluate_one(model, name, args, langs)
    if len(args.load_file) > 1:
        print(side_by_side(everything))
    if args.json:
        data = results if len(everything) == 1 else {"models": everything}
        with atomic_output(args.json, "w") as f:
            json.dump(json_safe(data), f, indent=1)
            f.write("\n")
    return 0


def evaluate_one(model, name: str | None, args: argparse.Namespace, langs: list[str]) -> dict:
    """One model's tables and notes, printed; returns its figures with where they came from."""
    start = time.perf_counter()
    results = evaluate(model, args.data_dir, args.tasks, langs, args.batch_size, args.require_all)
    seconds = time.perf_counter() - start
    compare = args.compare and not model.config.get("multilingual")
    if compare:
        results["paper_sp"] = PAPER_SP
    print(report(results, compare))
    if args.compare and not compare:
        print(f"\nnote: {MULTILINGUAL_NOTE}")
    crossing = f"(STS 2017's other pairs, {', '.join(RETRIEVAL)} are cross-lingual)"
    across = set(args.tasks) & {"sts17", *RETRIEVAL}
    if across and static.english_only(name):
        print(f"\nnote: {static.ENGLISH_ONLY} {crossing}")
    elif across and not model.config.get("multilingual"):
        print(
            f"\nnote: {name} is not marked multilingual: a model trained on one language scores "
            f"near chance across languages {crossing}; train on bitext for them (docs/training.md)"
        )
    print(f"\n{model!r}; evaluated in {seconds:.1f} s")
    return {"model": name, "data_dir": str(args.data_dir), "seconds": seconds, **results}


def headline(results: dict) -> dict[str, float]:
    """Each task's figures that a comparison reads: STS years and their mean, each pair set's Pearson, each
    language's retrieval error and their mean."""
    out = {}
    if "sts" in results:
        out |= {f"STS {y} (r)": m["pearson"] for y, m in results["sts"]["years"].items()}
        out["STS 2012-2016 avg (r)"] = results["sts"]["avg"]["pearson"]
    for task in ("sts17", "stsb", "sick"):
        out |= {f"{task} {k} (r)": m["pearson"] for k, m in results.get(task, {}).get("sets", {}).items()}
    for task in RETRIEVAL:
        if task in results:
            out |= {f"{task} {lang} (err)": m["mean"] for lang, m in results[task]["langs"].items()}
            out[f"{task} avg (err)"] = results[task]["avg"]["mean"]
    return out


def side_by_side(everything: dict[str, dict]) -> str:
    """The models' headline figures in one table, numbered [1], [2], ... under a legend of their paths, with each
    model's difference from the first ([2]-[1], ...): a column's model is named however long its path."""
    names = list(everything)
    figures = {name: headline(r) for name, r in everything.items()}
    rows = list(dict.fromkeys(k for f in figures.values() for k in f))
    width, cell = max(map(len, rows), default=10), 9
    legend = [f"  [{k}] {name}" for k, name in enumerate(names, 1)]
    head = f"{'':<{width}}" + "".join(f" {f'[{k}]':>{cell}}" for k in range(1, len(names) + 1))
    head += "".join(f" {f'[{k}]-[1]':>{cell}}" for k in range(2, len(names) + 1))
    lines = ["Side by side (r: Pearson x 100, higher is better; err: error rate x 100, lower is better)", *legend, head]
    for row in rows:
        values = [figures[n].get(row, math.nan) for n in names]
        cells = "".join(f" {fmt(v, cell)}" for v in values)
        cells += "".join(
            f" {v - values[0]:+{cell}.1f}" if math.isfinite(v - values[0]) else f" {'-':>{cell}}" for v in values[1:]
        )
        lines.append(f"{row:<{width}}{cells}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
