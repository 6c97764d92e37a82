"""Write the training text of the multilingual model into OUT_DIR, in fixed seeded orders:

mono.<lang>.txt     distinct monolingual sentences of train/foreign_text (at most --max-mono per language)
bitext.tsv          english<TAB>foreign<TAB>lang: clean bitext (no Tatoeba-Challenge, no paragraph files)
                    (--wmt: and the WMT systems' bitext; exact duplicates, such as a WMT source and reference
                    found in both train/bitext/wmt and wmt_systems, kept once; the held-apart WMT sets never)
                    (--challenge: and the Tatoeba-Challenge bitext, less every pair with a side near a sentence of
                    the LASER Tatoeba test set: its models report PUD and FLORES beside Tatoeba)
heldout.<lang>.tsv  --heldout pairs per language cut from that bitext: a dev set, never trained on
heldout-challenge.<lang>.tsv  with --challenge, --heldout Tatoeba-Challenge pairs cut the same way: a dev set of
                    Tatoeba's register (short everyday sentences), never trained on
en.txt              the first --max-en English sentences of ENGLISH_TEXT (the English default's text)

--langs names the languages (default the shipped model's seven); one with no monolingual text (Japanese) gets an
empty mono file, and --wmt LANG ... adds the WMT systems' bitext of those languages only.

python scripts/multilingual_text.py DATA_DIR OUT_DIR [--langs ar de es fr ja ru tr zh --wmt ja]
"""

import argparse
import collections
import contextlib
import gzip
import itertools
import random
import re
from pathlib import Path

from paraphrastic.fileio import atomic_output
from paraphrastic.preprocess import wmt

LANGS = ("ar", "de", "es", "fr", "ru", "tr", "zh")
# bitext file names per language: the two-letter code, or NTREX's three-letter codes (both Chinese scripts)
CODES = {
    "ar": "ar|arb",
    "de": "de|deu",
    "es": "es|spa",
    "fr": "fr|fra",
    "ru": "ru|rus",
    "tr": "tr|tur",
    "zh": "zh|zho-CN|zho-TW",
    "ja": "ja|jpn",
}


def bitext_files(data: Path, lang: str) -> list[Path]:
    """Every en-<lang> bitext file but Tatoeba-Challenge (near-duplicates of the Tatoeba test), the
    paragraph-long files (WMT 2024 paragraphs, XQuAD contexts) and the WMT systems' outputs (`wmt_files`)."""
    return [p for p in language_files(data, lang) if p.parent.name != wmt.BITEXT.name]


def wmt_files(data: Path, lang: str) -> list[Path]:
    """The WMT systems' en-<lang> bitext (machine translations of WMT test sets, and the reverse)."""
    return [p for p in language_files(data, lang) if p.parent.name == wmt.BITEXT.name]


def language_files(data: Path, lang: str) -> list[Path]:
    name = re.compile(rf"en-({CODES[lang]})(\..*)?\.tsv\.gz$")
    return [
        p
        for p in sorted((data / "train" / "bitext").glob("*/*.tsv.gz"))
        if name.match(p.name) and "tatoeba" not in p.parent.name and not re.search("paragraphs|contexts", p.name)
    ]


# Tatoeba-Challenge's and the LASER Tatoeba test set's codes of each language (Mandarin: `zho` and `cmn`)
TATOEBA = {"ar": ("ara", "ara"), "de": ("deu", "deu"), "es": ("spa", "spa"), "fr": ("fra", "fra"),
           "ru": ("rus", "rus"), "tr": ("tur", "tur"), "zh": ("zho", "cmn"), "ja": ("jpn", "jpn")}  # fmt: skip
NEAR = 0.5  # a Tatoeba-Challenge sentence whose character trigrams overlap a test sentence's this much is dropped


def trigrams(sentence: str) -> set[str]:
    """The character trigrams of a sentence lowercased, punctuation dropped, words joined by one space."""
    text = " " + " ".join(re.sub(r"[\W_]+", " ", sentence.lower()).split()) + " "
    return {text[i : i + 3] for i in range(len(text) - 2)}


class NearTest:
    """Whether a sentence is near one of a set of test sentences: Jaccard overlap of their character trigrams at
    least NEAR, looked up through the test sentences' rarer trigrams (a near copy shares some of them)."""

    def __init__(self, test: list[str]):
        self.test, self.index = [trigrams(s) for s in test], collections.defaultdict(list)
        for i, grams in enumerate(self.test):
            for gram in grams:
                self.index[gram].append(i)

    def __call__(self, sentence: str) -> bool:
        return self.closest(sentence) >= NEAR

    def closest(self, sentence: str) -> float:
        """The largest trigram overlap (Jaccard) of `sentence` with a test sentence, among the ten that share the
        most of its rarer trigrams, ties to the earlier test sentence (0 when none shares one). The ties are broken
        by position, not by the order of a set of strings, which follows Python's hash seed from run to run."""
        grams, shared = trigrams(sentence), collections.Counter()
        for gram in grams:
            if len(self.index.get(gram, ())) < 200:
                shared.update(self.index.get(gram, ()))
        best = sorted(shared.items(), key=lambda item: (-item[1], item[0]))[:10]
        return max((len(grams & self.test[i]) / len(grams | self.test[i]) for i, _ in best), default=0.0)


def challenge_pairs(data: Path, lang: str, near_english: NearTest) -> tuple[list[tuple[str, str]], int]:
    """The Tatoeba-Challenge (english, foreign) pairs of `lang`, less those with a side near the LASER Tatoeba
    test set (its foreign side against the language's test sentences, its English side against the English test
    sentences of all seven languages), and how many were dropped."""
    test = TATOEBA[lang][1]
    near_foreign = NearTest(read_test(data, test, test))
    pairs = bitext_pairs(challenge_file(data, lang))
    kept = [(en, xx) for en, xx in pairs if not near_english(en) and not near_foreign(xx)]
    return kept, len(pairs) - len(kept)


def challenge_file(data: Path, lang: str) -> Path:
    """The Tatoeba-Challenge bitext file of `lang` (english<TAB>foreign)."""
    return data / "train" / "bitext" / "tatoeba_challenge_v2021-08-07" / f"en-{TATOEBA[lang][0]}.tsv.gz"


def read_test(data: Path, lang: str, side: str) -> list[str]:
    return (data / "tatoeba" / f"{lang}-eng.{side}").read_text(encoding="utf-8").splitlines()


def bitext_pairs(path: Path) -> list[tuple[str, str]]:
    """The (english, foreign) pairs of a gzipped TSV, both sides stripped, pairs with an empty side dropped."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    return [(r[0].strip(), r[1].strip()) for r in rows if len(r) >= 2 and r[0].strip() and r[1].strip()]


def distinct(lines) -> list[str]:
    return list(dict.fromkeys(s for s in lines if s))


def spans(sentences: list[str], count: int, seed: str) -> list[str]:
    """`count` distinct random spans of 3-10 words (4-16 characters for text without spaces, Chinese) of the
    sentences: short text, like the everyday sentences and captions of the test sets."""
    rng, out = random.Random(seed), {}
    for _ in range(50 * count):
        if len(out) == count:
            break
        sentence = rng.choice(sentences)
        units, joiner = (sentence.split(), " ") if " " in sentence else (list(sentence), "")
        lo, hi = (3, 10) if joiner else (4, 16)
        if len(units) <= lo:
            continue
        length = rng.randint(lo, min(hi, len(units) - 1))
        start = rng.randrange(len(units) - length + 1)
        out[joiner.join(units[start : start + length])] = None
    return list(out)


def write_lines(path: Path, lines: list[str]) -> None:
    with atomic_output(path, "w") as f:
        f.write("".join(s + "\n" for s in lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--max-mono", type=int, default=200_000, help="monolingual sentences per language (200,000)")
    p.add_argument("--max-en", type=int, default=100_000, help="English sentences (100,000)")
    p.add_argument("--heldout", type=int, default=300, help="held-apart bitext pairs per language (300)")
    p.add_argument("--langs", nargs="+", choices=sorted(CODES), default=list(LANGS), help="languages (the seven)")
    p.add_argument("--wmt", nargs="*", metavar="LANG", help="add the WMT systems' bitext of LANG ... (none: of all)")
    p.add_argument("--max-wmt", type=int, help="at most this many WMT systems' pairs a language (default: all)")
    p.add_argument("--challenge", action="store_true", help="add the Tatoeba-Challenge bitext (near-test pairs out)")
    args = p.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    never = wmt.held_apart_sentences(args.data_dir) if (args.data_dir / wmt.GROUPS).exists() else set()
    with_wmt = set(args.langs if args.wmt == [] else args.wmt or [])
    if args.challenge:
        test_english = {lang: read_test(args.data_dir, TATOEBA[lang][1], "eng") for lang in {*LANGS, *args.langs}}
        near_english = NearTest([s for lang in LANGS for s in test_english[lang]])
        # pairs near the English test sentences of a language beyond the seven are dropped from training after the
        # held-apart pairs are drawn, so that those are the same with or without that language
        near_added = NearTest([s for lang in args.langs if lang not in LANGS for s in test_english[lang]])
    train, challenge_held = [], set()  # the sides of held-apart Challenge pairs: trained in no language
    for lang in args.langs:
        mono_file = args.data_dir / "train" / "foreign_text" / f"{lang}.txt.gz"
        with gzip.open(mono_file, "rt", encoding="utf-8") if mono_file.exists() else contextlib.nullcontext([]) as f:
            mono = distinct(line.strip() for line in f)
        random.Random(lang).shuffle(mono)
        write_lines(args.out_dir / f"mono.{lang}.txt", mono[: args.max_mono])
        pairs = list(dict.fromkeys(pair for path in bitext_files(args.data_dir, lang) for pair in bitext_pairs(path)))
        random.Random(lang).shuffle(pairs)
        held, rest = pairs[: args.heldout], pairs[args.heldout :]
        if lang in with_wmt:  # after the held-apart pairs are drawn, so that they are the same with or without
            known = set(rest)
            added = dict.fromkeys(pair for path in wmt_files(args.data_dir, lang) for pair in bitext_pairs(path))
            added = [pair for pair in added if pair[0] not in never and pair not in known]
            random.Random(lang).shuffle(added)
            rest += added[: args.max_wmt]
        held_sides = {s for pair in held for s in pair}
        if args.challenge:  # after the other held-apart pairs, so that those are the same with or without
            known = set(rest) | set(held)
            added, dropped = challenge_pairs(args.data_dir, lang, near_english)
            added = [pair for pair in dict.fromkeys(added) if pair not in known]
            random.Random(f"{lang}-challenge").shuffle(added)
            write_lines(
                args.out_dir / f"heldout-challenge.{lang}.tsv", [f"{en}\t{xx}" for en, xx in added[: args.heldout]]
            )
            challenge_held |= {s for pair in added[: args.heldout] for s in pair}
            rest += added[args.heldout :]
            print(f"{lang}: Tatoeba-Challenge {len(added)} pairs ({dropped} near the Tatoeba test dropped)")
        rest = [pair for pair in rest if pair[0] not in held_sides and pair[1] not in held_sides]
        write_lines(args.out_dir / f"heldout.{lang}.tsv", [f"{en}\t{xx}" for en, xx in held])
        train += [(en, xx, lang) for en, xx in rest]
        print(f"{lang}: {min(len(mono), args.max_mono)} monolingual, {len(rest)} bitext pairs, {len(held)} held out")
    train = [pair for pair in train if pair[0] not in challenge_held and pair[1] not in challenge_held]
    if args.challenge and near_added.test:
        kept = [pair for pair in train if not near_added(pair[0])]
        print(f"{len(train) - len(kept)} pairs near the English of the added languages' Tatoeba test dropped")
        train = kept
    write_lines(args.out_dir / "bitext.tsv", ["\t".join(pair) for pair in train])
    with gzip.open(args.data_dir / "train" / "en_text" / "enwiki_2018_articles.txt.gz", "rt", encoding="utf-8") as f:
        english = [line.strip() for line in itertools.islice(f, args.max_en)]
    write_lines(args.out_dir / "en.txt", english)


if __name__ == "__main__":
    main()
