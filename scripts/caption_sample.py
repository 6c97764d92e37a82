"""The seeded sample of 50,000 caption pairs that scripts/compare_encoders.sh and scripts/gran_and_filters.sh
train on: python scripts/caption_sample.py PAIRS.tsv.gz OUT.tsv"""

import gzip
import sys

import numpy as np

lines = gzip.open(sys.argv[1], "rt", encoding="utf-8").read().splitlines()
keep = np.sort(np.random.default_rng(0).permutation(len(lines))[:50_000])
open(sys.argv[2], "w", encoding="utf-8").write("".join(lines[i] + "\n" for i in keep))
