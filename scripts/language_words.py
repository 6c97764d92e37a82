"""Write data/languages.json: the 1,000 most frequent words of English, German, French, Spanish and Turkish in our
own training text, with their frequencies, from which `language.py` tells English from the Latin-script languages
the English model cannot read (its unknown-piece check catches other scripts).

    python scripts/language_words.py [DATA_DIR]

English from Wikipedia text (train/en_text) and image captions (the first column of train/en_paraphrase's
Multi30k pairs), the others from train/foreign_text; of each file's first 200,000 lines every fifth (0, 5, 10, ...)
is held apart for the tests and never counted.
"""

import argparse
import gzip
import itertools
import json
from collections import Counter
from pathlib import Path

from paraphrastic.language import HELD_APART, LANGUAGES, WORDS, words
from paraphrastic.options import default_data_dir

SOURCES = {
    "en": ["en_text/enwiki_early_articles.txt.gz", "en_paraphrase/multi30k_task2_en_captions.pairs.tsv.gz"],
    **{lang: [f"foreign_text/{lang}.txt.gz"] for lang in LANGUAGES[1:]},
}
TOP, LINES = 1000, 200_000


def counted(path: Path) -> Counter:
    counts: Counter = Counter()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(itertools.islice(f, LINES)):
            if i % HELD_APART:
                counts.update(words(line.split("\t")[0]))
    return counts


def frequencies(counts: Counter) -> dict[str, float]:
    total = sum(counts.values())
    return {word: float(f"{n / total:.3g}") for word, n in counts.most_common(TOP)}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir", type=Path, nargs="?", default=default_data_dir())
    args = p.parse_args()
    found = {lang: frequencies(sum((counted(args.data_dir / "train" / s) for s in srcs), Counter()))
             for lang, srcs in SOURCES.items()}  # fmt: skip
    meta = {"top": TOP, "lines": LINES, "held_apart": HELD_APART, "sources": SOURCES}
    WORDS.write_text(json.dumps(meta | {"words": found}, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {WORDS}: {TOP} words each of {', '.join(found)}")
