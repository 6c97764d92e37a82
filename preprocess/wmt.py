"""The WMT21-24 systems' outputs in ../shared/data: groups of English paraphrases (every translation of one source
segment) and bitext. Two whole test sets are held apart as a dev set of their registers (news, conversation,
e-commerce, social): no sentence of theirs is ever trained on, and `dev_pairs` turns them into a retrieval task.
"""

import gzip
import random
import re
from collections.abc import Iterator
from pathlib import Path

# Test sets that never train: their English sentences are dropped from every training file (groups, pairs, bitext).
# Both are from 2023, which train/bitext/wmt/ (the 2021-2022 sources and references) does not hold, so no model
# trained before this data saw them.
HELD_APART = ("generaltest2023.he-en", "generaltest2023.ja-en")
GROUPS = Path("train/en_paraphrase/wmt_systems.groups.tsv.gz")
PAIRS = Path("train/en_paraphrase/wmt_systems.pairs.tsv.gz")
BITEXT = Path("train/bitext/wmt_systems")


def read_groups(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(set name, distinct sentences) per line of a groups file (`SET<TAB>ID<TAB>s1<TAB>s2...`, the layout of the
    caption groups too: `split<TAB>image<TAB>captions...`)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            yield cols[0], list(dict.fromkeys(s for s in cols[2:] if s))


def held_apart_sentences(data: Path) -> set[str]:
    """Every English sentence of the held-apart test sets."""
    return {s for name, group in read_groups(data / GROUPS) if name in HELD_APART for s in group}


def training_groups(data: Path) -> list[list[str]]:
    """The groups of the sets that train, each without any held-apart sentence."""
    held = held_apart_sentences(data)
    groups = ([s for s in group if s not in held] for name, group in read_groups(data / GROUPS))
    return [group for group in groups if len(group) > 1]


def training_pairs(data: Path) -> Iterator[tuple[str, str, str]]:
    """The pairs file's paraphrase pairs (low overlap, at most 6 a group) with no held-apart sentence on either side,
    in file order, each with the number of its group (its first sentence's first group in the groups file), so that
    no member of a group is mined as another's negative: margin-loss pairs for the English recipe's MARGIN."""
    held, group = held_apart_sentences(data), {}
    for k, (_, members) in enumerate(read_groups(data / GROUPS)):
        for sentence in members:
            group.setdefault(sentence, k)
    with gzip.open(data / PAIRS, "rt", encoding="utf-8") as f:
        for line in f:
            a, b = line.rstrip("\n").split("\t")
            if a not in held and b not in held:
                yield a, b, str(group.get(a, group.get(b, -1)))


def words(sentence: str) -> set[str]:
    return set(re.findall(r"\w+", sentence.lower()))


def overlap(a: str, b: str) -> float:
    """Shared words over the words of the shorter sentence (0 when either has none)."""
    wa, wb = words(a), words(b)
    return len(wa & wb) / min(len(wa), len(wb)) if wa and wb else 0.0


def dev_pairs(data: Path, exclude: set[str] = frozenset()) -> list[tuple[str, str]]:
    """One pair per held-apart group: its first sentence (a human reference) and the member that shares the fewest
    of its words (the hardest paraphrase to find), in file order. Sentences in `exclude` (the text the default was
    trained on before this data came, which holds a few short ones such as "Thank you in advance.") are left out,
    and groups left with one sentence skipped."""
    pairs = []
    for name, group in read_groups(data / GROUPS):
        group = [s for s in group if s not in exclude]
        if name in HELD_APART and len(group) > 1:
            query = group[0]
            pairs.append((query, min(group[1:], key=lambda s: overlap(query, s))))
    return pairs


def english_sentences(data: Path, exclude: set[str] = frozenset()) -> list[str]:
    """Distinct English sentences of the training groups and of the English side of the bitext, none held apart
    nor in `exclude` (text already taught), in a seeded order."""
    held = held_apart_sentences(data) | set(exclude)
    seen = dict.fromkeys(s for group in training_groups(data) for s in group if s not in held)
    for path in sorted((data / BITEXT).glob("en-*.tsv.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            seen.update((s, None) for s in (line.split("\t", 1)[0].strip() for line in f) if s and s not in held)
    sentences = list(seen)
    random.Random(0).shuffle(sentences)
    return sentences
