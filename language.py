"""Which language a line is in, told apart from English by the most frequent words of each language in our own
training text (data/languages.json, written by scripts/language_words.py): English, German, French, Spanish and
Turkish. The English model reads other scripts as unknown pieces, which static.unknown_warning catches; text in these
Latin-script languages it reads as English word pieces, silently, so it is caught here."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

WORDS = Path(__file__).resolve().parent / "data" / "languages.json"
LANGUAGES = ("en", "de", "fr", "es", "tr")
NAMES = {"de": "German", "fr": "French", "es": "Spanish", "tr": "Turkish"}
HELD_APART = 5  # every fifth line of the training text is never counted: the tests read those
WORD = re.compile(r"[^\W\d_]+")
MARGIN = 3.0  # how much likelier (log) another language must make a text than English


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


@functools.cache
def frequencies() -> tuple[dict[str, int], np.ndarray]:
    """Each listed word's row, and a table of log frequencies (words x languages); a language whose list lacks a
    word gives it half its rarest listed word's frequency."""
    lists = json.loads(WORDS.read_text(encoding="utf-8"))["words"]
    index = {word: i for i, word in enumerate(dict.fromkeys(w for lang in LANGUAGES for w in lists[lang]))}
    table = np.empty((len(index), len(LANGUAGES)))
    for k, lang in enumerate(LANGUAGES):  # each listed word looked up once: every command's start-up pays this
        listed = lists[lang]
        table[:, k] = min(listed.values()) / 2
        table[[index[word] for word in listed], k] = list(listed.values())
    return index, np.log(table)


def guess(texts: Sequence[str]) -> list[str]:
    """Per text: the language under which its listed words are likeliest, another than English only by a margin of
    MARGIN (natural log); "" for a text with fewer than two listed words."""
    index, table = frequencies()
    rows, ends = [], []
    for text in texts:
        rows += [index[word] for word in words(text) if word in index]
        ends.append(len(rows))
    summed = np.concatenate([np.zeros((1, len(LANGUAGES))), np.cumsum(table[rows], axis=0)])
    ends = np.array(ends, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    score = summed[ends] - summed[starts]
    best = score.argmax(axis=1)
    foreign = score[np.arange(len(texts)), best] - score[:, 0] >= MARGIN
    return ["" if n < 2 else LANGUAGES[b] if f else "en" for n, b, f in zip(ends - starts, best, foreign, strict=True)]


def tally(texts: Sequence[str], stats: dict, sample: int = 64) -> None:
    """Count in `stats` the languages other than English guessed for about `sample` evenly spread texts, and how many
    were checked (cheap enough for every job of a long file)."""
    checked = texts[:: max(1, len(texts) // sample)]
    stats["language_checked"] = stats.get("language_checked", 0) + len(checked)
    for lang in guess(checked):
        if lang and lang != "en":
            stats[f"language_{lang}"] = stats.get(f"language_{lang}", 0) + 1


def foreign_warning(stats: dict, what: str = "the sentences") -> str | None:
    """The warning for text the English model cannot read although its script is Latin: when a fifth or more of
    the texts checked look German, French, Spanish or Turkish; None otherwise."""
    found = {lang: stats.get(f"language_{lang}", 0) for lang in NAMES}
    checked = max(stats.get("language_checked", 0), 1)
    if sum(found.values()) < max(0.2 * checked, 2):
        return None
    names = " and ".join(NAMES[lang] for lang, n in sorted(found.items(), key=lambda kv: -kv[1]) if n >= 0.05 * checked)
    return (
        f"warning: {sum(found.values()) / checked:.0%} of {what} checked ({checked:,}) look {names}: the shipped "
        "English model reads English only, so their vectors mean little; use --load-file multilingual"
    )
