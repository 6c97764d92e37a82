"""The WMT systems' data: groups read as caption groups are, the held-apart test sets never in any training text,
and their dev pairs."""

from __future__ import annotations

import gzip
import subprocess
import sys

import pytest
from conftest import ROOT

from paraphrastic.preprocess import wmt
from paraphrastic.teacher import english_training_sentences


def write_gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def small_data(root):
    """A data folder with two WMT groups that train, one held apart, and bitext that repeats a held-apart sentence."""
    held = wmt.HELD_APART[0]
    write_gz(
        root / wmt.GROUPS,
        [
            "newstest2021.de-en\t1\tThe cat sat down.\tA cat sat.\tThe cat sat down.",
            f"{held}\t7\tPrices rose sharply in May.\tIn May prices went up a lot.\tPrices rose in May.",
            "generaltest2022.zh-en\t2\tHello there.",
        ],
    )
    write_gz(root / wmt.PAIRS, ["The cat sat down.\tA cat sat.", "Prices rose in May.\tPrices went up in May."])
    write_gz(root / wmt.BITEXT / "en-he.tsv.gz", ["Prices rose in May.\tמחירים", "Rain is coming.\tגשם"])
    write_gz(root / "train/en_paraphrase/captions.pairs.tsv.gz", ["A dog runs.\tA dog is running."])
    write_gz(root / "train/bitext/newstest/en-de.2019.tsv.gz", ["Good morning.\tGuten Morgen."])
    return root


def test_groups_keep_distinct_sentences_and_drop_lone_ones(tmp_path):
    data = small_data(tmp_path)
    groups = list(wmt.read_groups(data / wmt.GROUPS))
    assert groups[0] == ("newstest2021.de-en", ["The cat sat down.", "A cat sat."])
    assert wmt.training_groups(data) == [["The cat sat down.", "A cat sat."]]  # held apart and lone groups left out


def test_held_apart_sentences_are_never_training_text(tmp_path):
    data = small_data(tmp_path)
    held = wmt.held_apart_sentences(data)
    assert held == {"Prices rose sharply in May.", "In May prices went up a lot.", "Prices rose in May."}
    base = english_training_sentences(data)
    assert sorted(base) == ["A dog is running.", "A dog runs.", "Good morning."]  # the WMT files only on request
    added = wmt.english_sentences(data, exclude=set(base))
    assert sorted(added) == ["A cat sat.", "Rain is coming.", "The cat sat down."]
    assert not held & set(added)


def test_a_dev_pair_is_the_reference_and_its_least_overlapping_paraphrase(tmp_path):
    assert wmt.dev_pairs(small_data(tmp_path)) == [("Prices rose sharply in May.", "In May prices went up a lot.")]
    assert wmt.overlap("a b c", "c d") == 0.5 and wmt.overlap("", "a") == 0.0


def test_margin_pairs_drop_every_pair_with_a_held_apart_side_and_name_their_group(tmp_path):
    assert list(wmt.training_pairs(small_data(tmp_path))) == [("The cat sat down.", "A cat sat.", "0")]


def test_the_scripts_keep_the_held_apart_sets_out(tmp_path):
    data = small_data(tmp_path)
    run = [sys.executable, str(ROOT / "scripts/english_sentences.py"), str(data)]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.split("\n")[:-1] == list(
        english_training_sentences(data)
    )
    wmt_text = subprocess.run([*run, "--wmt"], capture_output=True, text=True, check=True).stdout
    assert sorted(wmt_text.splitlines()) == ["A cat sat.", "Rain is coming.", "The cat sat down."]


@pytest.mark.long
def test_no_held_apart_sentence_is_in_the_real_training_text(shared_data):
    held, base = wmt.held_apart_sentences(shared_data), set(english_training_sentences(shared_data))
    assert len(held & base) < 30  # a few short ones the older text holds ("Yes.", "Thank you in advance.")
    assert not held & set(wmt.english_sentences(shared_data, exclude=base))
    pairs = list(wmt.training_pairs(shared_data))
    assert len(pairs) > 100_000 and not held & {s for pair in pairs for s in pair[:2]}
    groups = [set(members) for _, members in wmt.read_groups(shared_data / wmt.GROUPS)]
    assert sum(a in groups[int(k)] and b in groups[int(k)] for a, b, k in pairs) > 0.99 * len(pairs)
    dev = wmt.dev_pairs(shared_data, exclude=base)
    assert len(dev) > 3_000 and not base & {s for pair in dev for s in pair}


def test_the_group_negatives_script_counts_the_anchors(tmp_path):
    run = [sys.executable, str(ROOT / "scripts/group_negatives.py"), "--data-dir", str(small_data(tmp_path)),
           "--megabatches", "2"]  # fmt: skip
    done = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "0 of 0 anchors" in done or " of 4 anchors" in done  # one pair: its two sentences, twice
