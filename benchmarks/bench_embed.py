"""End-to-end embedding throughput of a paper-size SP model (50,000 pieces x 1024 dims), or of saved models.

Protocol: 120,000 English sentences from ../shared/data (fixed choice), sorted by length; raw text
in, float32 vectors out, tokenization included; median of several runs; 1 thread and all cores.
Also the paper's way (tokenization excluded) and where the time goes. With --model, each saved model in turn
(for example two vocabulary sizes of one width, measured in one run so that their ratio means something).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from common import machine_header, sentence_sample, sp_model_50k

from paraphrastic.models import SPModel, Tokenizer, load_model
from paraphrastic.pieces import flatten


def median_seconds(fn, runs: int) -> float:
    """Median wall time of `runs` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paper_size_model(dim: int = 1024) -> SPModel:
    """The paper's model size: 50,000 English pieces x `dim`, random weights (speed does not depend on them)."""
    torch.manual_seed(0)
    return SPModel(Tokenizer(sp_model_50k(), lowercase=True), torch.randn(50_000, dim)).eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=120_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--model", nargs="+", help="saved models (paths or names) to measure instead of the random one")
    args = p.parse_args()

    sentences = sorted(sentence_sample(args.sentences), key=len)
    print(machine_header())
    for model in [load_model(m).eval() for m in args.model] if args.model else [paper_size_model(args.dim)]:
        measure(model, sentences, args.runs)


def measure(model: SPModel, sentences: list[str], runs: int) -> None:
    """Print sentences/s end to end, tokenizing alone and pooling alone, at 1 thread and all cores."""
    tokenizer = model.tokenizer
    n = len(sentences)
    print(f"model: {len(tokenizer)} pieces x {model.dim} dims; {n} sentences sorted by length, median of {runs}")
    print(f"{'threads':>7} {'batch':>6} {'end-to-end sent/s':>18} {'tokenize sent/s':>16} {'pool only sent/s':>17}")
    for threads in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        for batch in (8192, 64):
            e2e = median_seconds(lambda b=batch: model.embed_raw_text(sentences, batch_size=b), runs)
            chunks = [sentences[i : i + batch] for i in range(0, n, batch)]
            tok = median_seconds(lambda c=chunks, t=threads: [tokenizer.encode(x, t) for x in c], runs)
            bags = [model.rows_and_offsets(*flatten(tokenizer.encode(c, threads))) for c in chunks]
            with torch.no_grad():
                pool = median_seconds(lambda b=bags: [model(ids, offsets) for ids, offsets in b], runs)
            print(f"{threads:>7} {batch:>6} {n / e2e:>18,.0f} {n / tok:>16,.0f} {n / pool:>17,.0f}")
    torch.set_num_threads(1)
    for k in (1, 10):  # a server's query: the time of one call, start to end
        each = median_seconds(lambda k=k: [model.encode(sentences[:k]) for _ in range(100)], runs) / 100
        print(f"encode of {k} sentence{'s' * (k > 1)} in one call: {each * 1e6:,.0f} us")
    tokens = sum(len(x) for x in tokenizer.encode(sentences, os.cpu_count() or 1))
    print(f"pieces per sentence: {tokens / n:.1f}; 'pool only' is the paper's protocol (tokenization excluded)")
    with torch.no_grad():
        vec = model.embed_raw_text(sentences[:1000])
    assert vec.shape == (1000, model.dim) and np.isfinite(vec).all()


if __name__ == "__main__":
    main()
