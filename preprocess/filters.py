"""Filters for paraphrase pairs (`s1<TAB>s2`), after Wieting, Mallinson and Gimpel (EMNLP 2017), "Learning
Paraphrastic Sentence Embeddings from Back-Translated Bitext": the second side's length, n-gram overlap,
sentence-level BLEU of one side against the other, and the second side's perplexity under an n-gram
language model trained on a reference text. Pure functions, and `filter_pairs`, which streams a file.

    python -m paraphrastic.preprocess.steps filter-pairs pairs.tsv --out kept.tsv --length 0 10 --overlap 1 --overlap-range 0 0.7
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from paraphrastic.fileio import atomic_output, iter_line_chunks, split_pair

TOKEN = re.compile(r"\w+|[^\w\s]")


def tokenize(sentence: str) -> list[str]:
    """Lowercased word and punctuation tokens (the papers tokenized with NLTK before counting n-grams)."""
    return TOKEN.findall(sentence.lower())


def ngrams(tokens: list[str], n: int) -> list[tuple[str, ...]]:
    return list(zip(*(tokens[k:] for k in range(n)), strict=False))


def ngram_overlap(a: list[str], b: list[str], n: int) -> float:
    """Share of the n-grams of the side with fewer n-grams (each position counted once) that also occur in
    the other side; 0 when that side has none. Ties take the first side as the shorter one (as ParaNMT)."""
    ga, gb = ngrams(a, n), ngrams(b, n)
    short, other = (gb, ga) if len(gb) < len(ga) else (ga, gb)
    if not short:
        return 0.0
    other = set(other)
    return sum(g in other for g in short) / len(short)


def sentence_bleu(hypothesis: list[str], reference: list[str], max_n: int = 4) -> float:
    """BLEU of one sentence against one reference, with add-one smoothing of the 2..max_n-gram precisions
    (Lin and Och 2004) so that a pair without a shared 4-gram does not score 0; in [0, 1]."""
    if not hypothesis or not reference:
        return 0.0
    logs = []
    for n in range(1, max_n + 1):
        hyp, ref = Counter(ngrams(hypothesis, n)), Counter(ngrams(reference, n))
        matches, total = sum((hyp & ref).values()), sum(hyp.values())
        smooth = 0 if n == 1 else 1
        if matches + smooth == 0:
            return 0.0
        logs.append(math.log((matches + smooth) / (total + smooth)))
    brevity = min(0.0, 1 - len(reference) / len(hypothesis))
    return math.exp(brevity + sum(logs) / max_n)


class NgramLM:
    """A word trigram language model: the trigram, bigram and add-one unigram estimates interpolated with
    fixed weights (a context never seen gives its weight to the lower orders). Small and exact, for ranking
    sentences by perplexity, not for state-of-the-art estimates."""

    WEIGHTS = (0.6, 0.3, 0.1)  # trigram, bigram, unigram

    def __init__(self, sentences: Iterable[list[str]]):
        self.counts: list[Counter] = [Counter(), Counter(), Counter()]  # unigrams, bigrams, trigrams
        self.contexts: list[Counter] = [Counter(), Counter()]  # bigram and trigram contexts
        for tokens in sentences:
            padded = ["<s>", "<s>", *tokens, "</s>"]
            for k in range(2, len(padded)):
                u, v, w = padded[k - 2 : k + 1]
                self.counts[0][w] += 1
                self.counts[1][v, w] += 1
                self.counts[2][u, v, w] += 1
                self.contexts[0][v] += 1
                self.contexts[1][u, v] += 1
        self.total = sum(self.counts[0].values())
        self.types = len(self.counts[0]) + 1  # and one for every unknown word

    def probability(self, u: str, v: str, w: str) -> float:
        """p(w | u v)."""
        unigram = (self.counts[0][w] + 1) / (self.total + self.types)
        bigram = self.counts[1][v, w] / self.contexts[0][v] if self.contexts[0][v] else None
        trigram = self.counts[2][u, v, w] / self.contexts[1][u, v] if self.contexts[1][u, v] else None
        p, spare = 0.0, 0.0
        for weight, estimate in zip(self.WEIGHTS, (trigram, bigram, unigram), strict=True):
            if estimate is None:  # a context never seen: its weight goes to the next order down
                spare += weight
            else:
                p, spare = p + (weight + spare) * estimate, 0.0
        return p

    def perplexity(self, tokens: list[str]) -> float:
        """exp of the mean negative log probability of the tokens and the sentence end."""
        padded = ["<s>", "<s>", *tokens, "</s>"]
        logs = [math.log(self.probability(*padded[k - 2 : k + 1])) for k in range(2, len(padded))]
        return math.exp(-sum(logs) / len(logs))


def train_lm(path: Path) -> NgramLM:
    """The trigram model of a reference text, one sentence per line, read in chunks."""
    return NgramLM(tokenize(line) for lines in iter_line_chunks(path) for line in lines)


def verdict(a: str, b: str, length, overlaps, bleu, lm: NgramLM | None, max_perplexity: float | None) -> str | None:
    """The first filter the pair fails ('length', 'overlap-N', 'bleu', 'perplexity'), None if it passes."""
    ta, tb = tokenize(a), tokenize(b)
    if length and not length[0] <= len(tb) <= length[1]:
        return "length"
    for n, low, high in overlaps:
        if not low <= ngram_overlap(ta, tb, n) <= high:
            return f"overlap-{n}"
    if bleu and not bleu[0] <= sentence_bleu(tb, ta) <= bleu[1]:
        return "bleu"
    if lm is not None and lm.perplexity(tb) > max_perplexity:
        return "perplexity"
    return None


def filter_pairs(
    src: Path,
    out: Path,
    length: tuple[int, int] | None = None,
    overlaps: list[tuple[int, float, float]] = (),
    bleu: tuple[float, float] | None = None,
    lm_text: Path | None = None,
    max_perplexity: float | None = None,
) -> dict:
    """Stream `src` and write the pairs that pass every filter given to `out` (atomically); returns how many
    were read and kept, and how many each filter dropped (a pair counts under the first it fails)."""
    lm = train_lm(lm_text) if lm_text is not None else None
    stats = Counter()
    line_no = 0
    with atomic_output(out, "w") as f:
        for lines in iter_line_chunks(src):
            kept = []
            for line in lines:
                line_no += 1
                a, b = split_pair(line, src, line_no)
                failed = verdict(a, b, length, overlaps, bleu, lm, max_perplexity)
                stats[failed or "kept"] += 1
                if failed is None:
                    kept.append(f"{a}\t{b}\n")
            f.write("".join(kept))
    return {"read": line_no, **{k: v for k, v in sorted(stats.items()) if k != "kept"}, "kept": stats["kept"]}
