"""Training: the loss and the mined negatives against hand and brute-force computation, the annealing
schedule, the sampler (text and HDF5 alike), kill-and-resume, refusal of foreign shards, and a short
learning run on real caption paraphrases."""

import gzip
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, generated_sentences, sp_model

from paraphrastic import (
    cuda_step,
    models,
    negatives,
    pieces,
    resume,
    run_setup,
    shards,
    static,
    train,
    train_config,
    workers,
)
from paraphrastic.fileio import InputError
from paraphrastic.pairs import PairData, PairSampler, ShardSet, shard_paths, tokenize_pairs


@pytest.fixture
def pairs_file(tmp_path):
    """Generated pairs; some lines repeat and some targets repeat, so duplicates reach the miner."""
    src, tgt = generated_sentences(300, seed=3), generated_sentences(300, seed=4)
    lines = [f"{s}\t{t}" for s, t in zip(src, tgt, strict=True)] + [f"{src[0]}\t{tgt[0]}", f"{src[5]}\t{tgt[9]}"]
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_args(pairs_file, sp_file, out, *extra):
    return [
        "--train-file", str(pairs_file), "--sp-model", str(sp_file), "--output-dir", str(out),
        "--dim", "16", "--batch-size", "8", "--megabatch-size", "3", "--megabatch-anneal", "2",
        "--threads", "1", "--log-every", "5", *extra,
    ]  # fmt: skip


def weights(path) -> torch.Tensor:
    return models.load_model(path).embedding.weight.detach()


# ----------------------------------------------------------------------------- objective


def test_margin_loss_matches_hand_computation():
    src = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    tgt = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
    neg_src = torch.tensor([[0.0, 1.0], [1.0, 0.0], [-1.0, 0.0], [1.0, 1.0]])
    neg_tgt = torch.tensor([[1.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, -1.0]])
    r = math.sqrt(0.5)
    # cos(s, t) = 1, 0, r, 1; cos(s, t') = 0, 1, -1, r; cos(t, s') = r, 1, r, -1
    one_sided = [max(0, 0.4 - 1 + 0), max(0, 0.4 - 0 + 1), max(0, 0.4 - r - 1), max(0, 0.4 - 1 + r)]
    other = [max(0, 0.4 - 1 + r), max(0, 0.4 - 0 + 1), max(0, 0.4 - r + r), max(0, 0.4 - 1 - 1)]
    assert train.margin_loss(torch.cat([src, tgt, neg_src]), [None], 0.4).item() == pytest.approx(
        sum(one_sided) / 4, abs=1e-6
    )
    both = train.margin_loss(torch.cat([src, tgt, neg_src, neg_tgt]), [None, None], 0.4).item()
    assert both == pytest.approx((sum(one_sided) + sum(other)) / 4, abs=1e-6)
    valid = torch.tensor([1.0, 0.0, 1.0, 1.0])
    masked = train.margin_loss(torch.cat([src, tgt, neg_src]), [valid], 0.4).item()
    assert masked == pytest.approx((sum(one_sided) - one_sided[1]) / 4, abs=1e-6)


@pytest.mark.parametrize("symmetric", [False, True])
def test_margin_loss_is_the_cosine_similarity_form_bit_for_bit(symmetric):
    """Each vector normalized once gives F.cosine_similarity's loss bit for bit, and its written-out gradient is
    autograd's through F.normalize to rounding; a zero vector (an empty bag) has cosine 0 either way, and a norm
    under the floor passes no gradient through the norm (where cosine_similarity's own gradient differs a little)."""
    vectors = torch.randn(4, 128, 64, generator=torch.Generator().manual_seed(5))
    vectors[0, 3] = 0
    vectors[1, 7] *= 1e-12
    vectors.requires_grad_()
    src, tgt, neg_src, neg_tgt = vectors
    valid = [(torch.arange(128) % 5 != 0).float(), (torch.arange(128) % 7 != 0).float()]
    positive = F.cosine_similarity(src, tgt)
    want = (0.4 - positive + F.cosine_similarity(src, neg_src)).clamp_min(0) * valid[0]
    if symmetric:
        want = want + (0.4 - positive + F.cosine_similarity(tgt, neg_tgt)).clamp_min(0) * valid[1]
    got = train.margin_loss(vectors[: 3 + symmetric].flatten(0, 1), valid[: 1 + symmetric], 0.4, weight=2.5)
    assert torch.equal(got, 2.5 * want.mean())
    unit = F.normalize(vectors, dim=2, eps=1e-8)
    hinges = 0.4 - (unit[0] * unit[1]).sum(-1) + (unit[: 1 + symmetric] * unit[2 : 3 + symmetric]).sum(-1)
    autograd = 2.5 * (hinges.clamp_min(0) * torch.stack(valid[: 1 + symmetric])).sum(0).mean()
    torch.testing.assert_close(*(torch.autograd.grad(loss, vectors)[0] for loss in (got, autograd)))


def random_megabatch(n: int, seed: int):
    """n pairs of random id sequences with exact duplicates planted across and within sides."""
    rng = np.random.default_rng(seed)
    sents = [list(rng.integers(0, 30, rng.integers(1, 5))) for _ in range(2 * n)]
    for a, b in rng.integers(0, 2 * n, (n // 2, 2)):
        sents[a] = list(sents[b])
    sents[1] = list(sents[n + 1])  # a pair whose two sides are identical
    lengths = torch.tensor([len(s) for s in sents])
    ids = torch.tensor([i for s in sents for i in s])
    return sents, ids, torch.cumsum(lengths, 0) - lengths


def brute_force_allowed(sents, x: int, bitext: bool, labels=None) -> list[int]:
    n = len(sents) // 2
    partner = lambda i: (i + n) % (2 * n)  # noqa: E731
    pool = (range(n, 2 * n) if x < n else range(n)) if bitext else range(2 * n)
    return [
        y
        for y in pool
        if sents[y] != sents[x] and sents[y] != sents[partner(x)] and sents[partner(y)] != sents[x] and y != x
        and (labels is None or labels[x] < 0 or labels[y] != labels[x])
    ]  # fmt: skip


@pytest.mark.parametrize("bitext", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("listed", [True, False])  # forbidden pairs listed, or compared by group per block
@pytest.mark.parametrize("chunk", [5, 8, 64])  # blocks ending past n, on n, and one block for all
@pytest.mark.parametrize("labelled", [False, True])  # the pairs name their paraphrase groups (some none)
def test_mined_negative_is_the_brute_force_argmax(bitext, precision, listed, chunk, labelled, monkeypatch):
    if not listed:
        monkeypatch.setattr(negatives, "MAX_LISTED_COPIES", 0)
    n = 23
    sents, ids, offsets = random_megabatch(n, seed=7 + bitext)
    vectors = torch.randn(2 * n, 12, generator=torch.Generator().manual_seed(1))
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    groups = negatives.sentence_groups(ids, offsets)
    labels = torch.randint(-1, 6, (n,), generator=torch.Generator().manual_seed(2)).repeat(2) if labelled else None
    got = negatives.mine_hardest(vectors, groups, bitext, dtype, chunk=chunk, labels=labels).tolist()
    unit = torch.nn.functional.normalize(vectors.double(), dim=1)
    cos = (unit @ unit.T).numpy()
    for x in range(2 * n):
        allowed = brute_force_allowed(sents, x, bitext, None if labels is None else labels.tolist())
        if not allowed:
            assert got[x] == -1
            continue
        assert got[x] in allowed, f"anchor {x}: mined {got[x]} is its partner, a duplicate or out of pool"
        best = max(cos[x, y] for y in allowed)
        assert cos[x, got[x]] >= best - (1e-6 if precision == "fp32" else 0.02)
        if precision == "fp32":
            assert got[x] == max(allowed, key=lambda y: cos[x, y])


def test_sentence_groups_are_exact_sequence_equality():
    sents, ids, offsets = random_megabatch(40, seed=3)
    groups = negatives.sentence_groups(ids, offsets).tolist()
    for i in range(len(sents)):
        for j in range(len(sents)):
            assert (groups[i] == groups[j]) == (sents[i] == sents[j])


def test_annealing_schedule():
    at = [train.megabatch_size_at(step, 4, 150) for step in (0, 149, 150, 299, 300, 450, 600, 10_000)]
    assert at == [1, 1, 2, 2, 3, 4, 4, 4]
    assert train.megabatch_size_at(0, 100, 0) == 100
    assert train.megabatch_size_at(10**6, 100, 150) == 100


def test_lazy_adam_equals_adam_when_every_row_has_a_gradient():
    table = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    dense = torch.nn.Parameter(table.clone())
    reference = torch.optim.Adam([dense], lr=0.01)
    lazy = train.LazyAdam(table, lr=0.01)
    rows = torch.arange(6)
    for k in range(5):
        grad = torch.randn(6, 4, generator=torch.Generator().manual_seed(10 + k))
        dense.grad = grad.clone()
        reference.step()
        lazy.step(rows, grad)
    torch.testing.assert_close(table, dense.detach(), rtol=1e-5, atol=1e-6)


def test_lazy_adam_leaves_untouched_rows_alone():
    table = torch.randn(6, 4)
    before = table.clone()
    lazy = train.LazyAdam(table, lr=0.01)
    lazy.step(torch.tensor([1, 4]), torch.ones(2, 4))
    assert torch.equal(table[[0, 2, 3, 5]], before[[0, 2, 3, 5]])
    assert not torch.equal(table[[1, 4]], before[[1, 4]])


def test_gradient_clipping_really_clips():
    grad = torch.full((4, 4), 2.0)
    assert train.clip_gradient([grad], 1.0) == pytest.approx(8.0)
    assert grad.norm().item() == pytest.approx(1.0, abs=1e-5)
    small = torch.full((2,), 0.1)
    train.clip_gradient([small], 1.0)
    assert torch.equal(small, torch.full((2,), 0.1))


# ----------------------------------------------------------------------------- data


def test_sampler_reads_each_pair_once_per_epoch_and_reshuffles(sp_bytes, pairs_file):
    source = tokenize_pairs(pairs_file, sp_model(sp_bytes), skip_bad=False, threads=1)
    sampler = PairSampler(source, seed=5, block=4, window=24)
    n = len(source)
    everything = PairData(*source.read(0, n))
    keys = [tuple(t) for t in np.split(everything.src[0], np.cumsum(everything.src[1])[:-1])]
    orders = []
    for epoch in (0, 1):
        parts = [sampler.read(epoch, start, 13) for start in range(0, n, 13)]
        got = PairData.concat(parts)
        seen = [tuple(t) for t in np.split(got.src[0], np.cumsum(got.src[1])[:-1])]
        assert sorted(seen) == sorted(keys)
        orders.append(seen)
    assert orders[0] != orders[1]
    again = PairSampler(source, seed=5, block=4, window=24).read(0, 20, 30)
    assert np.array_equal(again.src[0], sampler.read(0, 20, 30).src[0])


def test_a_third_column_names_each_pairs_group_and_the_sampler_carries_it(sp_bytes, tmp_path):
    """`s1<TAB>s2<TAB>GROUP` lines: groups numbered in order of first appearance (-1 for a line without one), each
    pair's group following it through the sampler's shuffle and the mega-batch's copy on the device; a line of an STS
    file (a number, then two sentences) is still refused."""
    src, tgt = generated_sentences(60, seed=11), generated_sentences(60, seed=12)
    lines = [f"{src[i]}\t{tgt[i]}" + (f"\t{i % 7}0" if i % 5 else "") for i in range(60)]
    lines[7] = f"5.\t{tgt[7]}\t{7 % 7}0"  # a number first: still a pair and its group
    path = tmp_path / "grouped.tsv"
    path.write_text("\n".join(lines) + "\n")
    source = tokenize_pairs(path, sp_model(sp_bytes), skip_bad=False, threads=1)
    named = [f"{i % 7}0" if i % 5 else None for i in range(60)]
    order = list(dict.fromkeys(g for g in named if g))
    assert source.groups.tolist() == [order.index(g) if g else -1 for g in named]
    model = sp_model(sp_bytes)

    def keys(data):  # each pair's ids, both sides
        return [(tuple(a), tuple(b)) for a, b in zip(*(np.split(ids, np.cumsum(lens)[:-1]) for ids, lens in
                                                      (data.src, data.tgt)), strict=True)]  # fmt: skip

    where = {key: i for i, key in enumerate(keys(PairData(*source.read(0, 60))))}
    assert len(where) == 60
    data = PairSampler(source, seed=3, block=4, window=16).read(0, 0, 60)
    assert [source.groups[where[key]] for key in keys(data)] == data.groups.tolist()  # each pair's own group
    mb = train.MegaBatch(model, data, torch.device("cpu"))
    assert mb.labels.tolist() == data.groups.tolist() * 2
    mb.mine(model, bitext=False, dtype=torch.float32)
    labels, negs = mb.labels.numpy(), mb.negatives.numpy()
    assert all(labels[x] < 0 or labels[y] != labels[x] for x, y in enumerate(negs) if y >= 0)
    for line in ("3.5\tA man plays.\tA man is playing.", "A man plays.\tA man is playing.\tg1"):
        path.write_text(line + "\n")
        with pytest.raises(InputError, match="found 2 tabs"):
            tokenize_pairs(path, sp_model(sp_bytes), skip_bad=False, threads=1)


def write_shards(source, sp_bytes, folder, cut: int):
    folder.mkdir()
    n = len(source)
    for k, (lo, hi) in enumerate([(0, cut), (cut, n)]):
        shards.write_shard(folder / f"part{k}.h5", *source.read(lo, hi), sp_bytes, lowercase=True)
    return folder


def test_read_many_is_the_ranges_read_one_by_one(sp_bytes, pairs_file, tmp_path):
    """A sampler's window reads its blocks with read_many: in memory and from shards (ranges across the shards'
    bound, out of order, overlapping, empty) it gives what read gives range by range, concatenated."""
    source = tokenize_pairs(pairs_file, sp_model(sp_bytes), skip_bad=False, threads=1)
    shard_set = ShardSet(shard_paths([str(write_shards(source, sp_bytes, tmp_path / "shards", cut=117))]), sp_bytes)
    n = len(source)
    starts = np.array([110, 0, 5, 117, 250, 3, 116, n - 1, 40, 40])
    stops = np.array([125, 8, 5, 118, n, 9, 117, n, 41, 72])
    for reader in (source, shard_set):
        got = PairData(*reader.read_many(starts, stops))
        want = PairData.concat([PairData(*reader.read(a, b)) for a, b in zip(starts, stops, strict=True) if a < b])
        for side in ("src", "tgt"):
            for k in (0, 1):
                assert np.array_equal(getattr(got, side)[k], getattr(want, side)[k])
        assert all(len(a) == len(b) == 0 for a, b in reader.read_many(starts[2:3], stops[2:3]))


def test_each_megabatch_is_read_once_the_next_during_the_last_update(pairs_file, sp_file, tmp_path, monkeypatch):
    """The trainer reads the next mega-batch's pairs at the last update of the current one (on a GPU, before a log
    waits for the device) and uses what it read: every mega-batch of every epoch read once, none twice."""
    reads, read = [], PairSampler.read
    monkeypatch.setattr(PairSampler, "read", lambda self, *key: reads.append(key) or read(self, *key))
    steps = []
    assert train.main(tiny_args(pairs_file, sp_file, tmp_path / "r", "--epochs", "2", "--megabatch-anneal", "0"),
                      on_step=lambda t: steps.append((t.step, t.ahead is not None))) == 0  # fmt: skip
    per_epoch = [(0, start, 24) for start in range(0, 300, 24)]  # 300 pairs, mega-batches of 3 x 8
    assert reads == per_epoch + [(1, start, count) for _, start, count in per_epoch]
    assert sum(ahead for _, ahead in steps) == 2 * (len(per_epoch) - 1)  # at each mega-batch's end but the epoch's


def test_text_and_hdf5_give_the_same_batches_and_weights(sp_bytes, sp_file, pairs_file, tmp_path):
    source = tokenize_pairs(pairs_file, sp_model(sp_bytes), skip_bad=False, threads=1)
    folder = write_shards(source, sp_bytes, tmp_path / "shards", cut=117)
    shard_set = ShardSet(shard_paths([str(folder)]), sp_bytes)
    text, hdf5 = PairSampler(source, 3, block=8, window=40), PairSampler(shard_set, 3, block=8, window=40)
    for epoch, start, count in [(0, 0, 50), (0, 50, 200), (1, 7, 90), (2, 290, 64)]:
        a, b = text.read(epoch, start, count), hdf5.read(epoch, start, count)
        for side in ("src", "tgt"):
            for k in (0, 1):
                assert np.array_equal(getattr(a, side)[k], getattr(b, side)[k])
    common = ["--max-steps", "12", "--dropout", "0.1"]
    assert train.main(tiny_args(pairs_file, sp_file, tmp_path / "a", *common)) == 0
    args = tiny_args(pairs_file, sp_file, tmp_path / "b", *common)
    args[args.index("--train-file") : args.index("--train-file") + 2] = ["--train-shards", str(folder)]
    assert train.main(args) == 0
    assert torch.equal(weights(tmp_path / "a" / "model.pt"), weights(tmp_path / "b" / "model.pt"))
    (tmp_path / "sp.model").write_bytes(sp_bytes)  # as preprocess/ leaves it: OUT/sp.model beside OUT/shards/
    args[args.index("--sp-model") : args.index("--sp-model") + 2] = []
    args[args.index("--output-dir") + 1] = str(tmp_path / "c")
    assert train.main(args) == 0, "--sp-model is found beside the shards"
    assert torch.equal(weights(tmp_path / "a" / "model.pt"), weights(tmp_path / "c" / "model.pt"))
    (tmp_path / "sp.model").unlink()
    args[args.index("--output-dir") + 1] = str(tmp_path / "d")
    assert train.main(args) == 2


def test_shard_from_another_sentencepiece_model_is_refused(
    sp_bytes, sp_file, pairs_file, corpus_file, tmp_path, capsys
):
    other = pieces.train_sentencepiece(corpus_file, vocab_size=40, num_threads=1)
    source = tokenize_pairs(pairs_file, sp_model(other), skip_bad=False, threads=1)
    folder = write_shards(source, other, tmp_path / "shards", cut=100)
    args = ["--train-shards", str(folder), "--sp-model", str(sp_file), "--output-dir", str(tmp_path / "out")]
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert "part0.h5" in err and "another sentencepiece model" in err and "Traceback" not in err


def test_bad_training_line_is_a_one_line_error(sp_file, tmp_path, capsys):
    path = tmp_path / "bad.tsv"
    path.write_text("a man\ta person\nno tab here\nx\ty\n")
    assert train.main(["--train-file", str(path), "--sp-model", str(sp_file), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and f"{path}:2:" in err and "\n" not in err


def test_gzip_training_file_and_outputs(sp_file, pairs_file, tmp_path):
    import gzip

    gz = tmp_path / "pairs.tsv.gz"
    gz.write_bytes(gzip.compress(pairs_file.read_bytes()))
    dev = tmp_path / "dev.tsv"
    scored = zip(generated_sentences(30, 8), generated_sentences(30, 9), strict=True)
    dev.write_text("".join(f"{i % 5}.0\t{a}\t{b}\n" for i, (a, b) in enumerate(scored)))
    out = tmp_path / "run"
    assert (
        train.main(tiny_args(gz, sp_file, out, "--max-steps", "10", "--save-every", "5", "--dev-file", str(dev))) == 0
    )
    assert {"model.pt", "best.pt", "resume.pt", "metrics.jsonl"} <= {p.name for p in out.iterdir()}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "dev"] == [5, 10]
    assert models.load_model(out / "best.pt").config["dim"] == 16
    state = torch.load(out / "resume.pt", weights_only=True)
    assert state["position"]["step"] == 10
    assert train.main(tiny_args(gz, sp_file, out, "--max-steps", "10")) == 2  # refuses to overwrite a run


# ----------------------------------------------------------------------------- resume


# train.main in a fresh interpreter that sends itself a signal right after update STEP (through on_step)
KILLER = (
    "import os, signal, sys; from paraphrastic import train; step, sig = int(sys.argv[1]), signal.Signals[sys.argv[2]]; "
    "sys.exit(train.main(sys.argv[3:], on_step=lambda t: t.step == step and os.kill(os.getpid(), sig)))"
)


def run_cli(args, kill: str | None = None) -> subprocess.CompletedProcess:
    """train.py as a user runs it; `kill` "STEP" or "STEP:INT" sends SIGKILL or SIGINT (Ctrl-C) after that update."""
    cmd = [sys.executable, str(ROOT / "train.py")]
    if kill:
        step, _, sig = kill.partition(":")
        cmd = [sys.executable, "-c", KILLER, step, "SIGINT" if sig == "INT" else "SIGKILL"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


def test_kill_and_resume_give_the_same_weights(sp_file, pairs_file, tmp_path):
    common = ["--max-steps", "50", "--save-every", "4", "--dropout", "0.1"]
    straight = tmp_path / "straight"
    assert train.main(tiny_args(pairs_file, sp_file, straight, *common)) == 0  # the kills need processes; this not

    killed = tmp_path / "killed"  # SIGKILL after step 10: resumes from the save at step 8, mid mega-batch
    assert run_cli(tiny_args(pairs_file, sp_file, killed, *common), kill="10").returncode == -9
    assert models.load_model(killed / "model.pt")  # what was left behind is a complete checkpoint
    assert torch.load(killed / "resume.pt", weights_only=True)["position"]["step"] == 8
    interrupted = run_cli(tiny_args(pairs_file, sp_file, killed, *common, "--resume"), kill="41:INT")
    assert interrupted.returncode == 130 and "--resume" in interrupted.stderr  # Ctrl-C saves, then stops
    assert torch.load(killed / "resume.pt", weights_only=True)["position"]["step"] == 41
    assert train.main(tiny_args(pairs_file, sp_file, killed, *common, "--resume")) == 0  # no kill: in process
    assert torch.equal(weights(straight / "model.pt"), weights(killed / "model.pt"))


def test_resume_refuses_changed_settings(sp_file, pairs_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(pairs_file, sp_file, out, "--max-steps", "3")) == 0
    assert train.main(tiny_args(pairs_file, sp_file, out, "--max-steps", "6", "--resume", "--delta", "0.3")) == 2
    assert "--delta 0.4 -> 0.3" in capsys.readouterr().err
    assert train.main(tiny_args(pairs_file, sp_file, out, "--max-steps", "6", "--resume")) == 0
    assert f"resuming from step 3 of {out}" in capsys.readouterr().out
    config = models.load_model(out / "model.pt").config["training"]["args"]
    assert config["train_file"] == pairs_file.name and config["output_dir"] == "run", "no paths of this machine"
    state = torch.load(out / "resume.pt", weights_only=True)  # as a version that let --relate-weight go unused saved it
    torch.save(state | {"args": state["args"] | {"relate_weight": 2.0, "distill_soft": 0.5}}, out / "resume.pt")
    assert train.main(tiny_args(pairs_file, sp_file, out, "--max-steps", "9", "--resume")) == 0  # they had no effect


# ----------------------------------------------------------------------------- learning


def test_short_run_on_caption_paraphrases_learns(shared_data, tmp_path):
    """Captions need a small mega-batch: with M >= 2 the hardest negatives are near-paraphrases."""
    from paraphrastic import evaluate

    with gzip.open(shared_data / "train" / "en_paraphrase" / "multi30k_task2_en_captions.pairs.tsv.gz", "rt") as f:
        pairs = tmp_path / "pairs.tsv"  # 40,000 pairs: 500 updates of 128 read them 1.6 times
        pairs.write_text("".join(itertools.islice(f, 40_000)), encoding="utf-8")
    sts17 = shared_data / "sts" / "2017" / "en-en.tsv"
    out = tmp_path / "run"
    args = [
        "--train-file", str(pairs), "--output-dir", str(out), "--vocab-size", "2000", "--dim", "300",
        "--max-steps", "500", "--megabatch-size", "1", "--lr", "0.01", "--log-every", "100",
    ]  # fmt: skip
    assert train.main(args) == 0
    tokenizer = models.Tokenizer((out / "sp.model").read_bytes(), lowercase=True)
    before = evaluate.score_sts_file(run_setup.new_model(train.parse_args(args), out, 1, True, sp=tokenizer), sts17)[
        "pearson"
    ]
    after = evaluate.score_sts_file(models.load_model(out / "model.pt"), sts17)["pearson"]
    print(f"STS 2017 en-en Pearson: {before:.2f} before training, {after:.2f} after")
    assert after > before + 10, (before, after)


def test_init_from_starts_from_the_model_table(tiny_model_file, tmp_path, capsys):
    """--init-from takes the model's tokenizer, dimension and table; training then moves the table."""
    pairs = zip(generated_sentences(300, 11), generated_sentences(300, 12), strict=True)
    (tmp_path / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    init = models.load_model(tiny_model_file)
    for lr, run in (("0", "frozen"), ("0.01", "moved")):
        args = ["--train-file", tmp_path / "pairs.tsv", "--output-dir", tmp_path / run, "--init-from", tiny_model_file]
        assert train.main([*map(str, args), "--max-steps", "3", "--megabatch-size", "1", "--lr", lr]) == 0
    frozen, moved = models.load_model(tmp_path / "frozen/model.pt"), models.load_model(tmp_path / "moved/model.pt")
    assert frozen.dim == init.dim == 16 and frozen.tokenizer.sp_model == init.tokenizer.sp_model
    assert torch.equal(frozen.embedding.weight, init.embedding.weight)
    assert not torch.equal(moved.embedding.weight, init.embedding.weight)
    args = ["--train-file", tmp_path / "pairs.tsv", "--output-dir", tmp_path / "set", "--init-from", tiny_model_file]
    with pytest.raises(SystemExit) as stop:  # what the model sets, asked again: named, where the run ignored it
        train_config.parse_args([*map(str, args), "--dim", "300", "--model", "word"])
    assert stop.value.code == 2 and "error: --init-from does not take --dim, --model (" in capsys.readouterr().err


def test_a_loss_option_without_its_loss_is_a_usage_error(capsys):
    """--distill-* without --distill, --relate-weight without --relate: named, where the run ignored them."""
    base = ["--train-file", "pairs.tsv", "--output-dir", "run"]
    cases = [
        (["--distill-soft", "0.1", "--distill-pool", "8"], "--distill does not take --distill-pool, --distill-soft ("),
        (["--relate-weight", "2"], "--relate does not take --relate-weight ("),
    ]
    for extra, named in cases:
        with pytest.raises(SystemExit) as stop:
            train_config.parse_args([*base, *extra])
        assert stop.value.code == 2 and f"error: a run without {named}" in capsys.readouterr().err
    assert train_config.parse_args([*base, "--distill-batch-size", "5", "--relate", "a", "b"])  # --relate's batches


def test_numbers_a_run_cannot_use_are_usage_errors(capsys):
    """nan and inf (a nan margin trained until the loss was nan, then blamed the learning rate), negative weights,
    and a gradient clip of 0 or less (below 0 it turned every gradient around): named before anything runs."""
    base = ["--train-file", "pairs.tsv", "--output-dir", "run"]
    cases = [
        (["--delta", "nan"], "argument --delta: expected a finite number, got 'nan'"),
        (["--lr", "inf"], "argument --lr: expected a finite number, got 'inf'"),
        (["--grad-clip", "-1"], "argument --grad-clip: must be at least 0.0, got -1"),
        (["--grad-clip", "0"], "--grad-clip must be above 0 (leave it out for no clipping)"),
        (["--margin-weight", "-1"], "argument --margin-weight: must be at least 0.0, got -1"),
        (["--distill-contrastive=-inf"], "argument --distill-contrastive: expected a finite number, got '-inf'"),
    ]
    for extra, named in cases:
        with pytest.raises(SystemExit) as stop:
            train_config.parse_args([*base, *extra])
        assert stop.value.code == 2 and named in capsys.readouterr().err
    assert train_config.parse_args([*base, "--lr", "0", "--margin-weight", "0"]).lr == 0  # a frozen table is allowed


def teacher_fixture(folder: Path, seed: int, dim: int) -> tuple[list[str], np.ndarray]:
    """sentences.txt and vectors.npy (random teacher vectors, one per sentence), and pairs.tsv to train on."""
    sentences = generated_sentences(200, seed)
    (folder / "sentences.txt").write_text("\n".join(sentences) + "\n")
    vectors = np.random.default_rng(seed).standard_normal((200, dim)).astype(np.float16)
    np.save(folder / "vectors.npy", vectors)
    pairs = zip(generated_sentences(300, 11), generated_sentences(300, 12), strict=True)
    (folder / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    return sentences, vectors.astype(np.float32)


def test_distillation_pulls_sentences_toward_their_targets(tiny_model_file, tmp_path):
    """With only the distillation loss, sentence vectors move toward their target vectors."""
    sentences, targets = teacher_fixture(tmp_path, 13, 16)

    def mean_cosine(model_file):
        vectors = models.load_model(model_file).embed_raw_text(sentences)
        return float(static.cosine(vectors, targets).mean())

    args = ["--train-file", tmp_path / "pairs.tsv", "--output-dir", tmp_path / "run", "--init-from", tiny_model_file]
    args += ["--distill", tmp_path / "sentences.txt", tmp_path / "vectors.npy", "--margin-weight", "0"]
    assert train.main([*map(str, args), "--max-steps", "60", "--megabatch-size", "1", "--lr", "0.05"]) == 0
    assert mean_cosine(tmp_path / "run/model.pt") > mean_cosine(tiny_model_file) + 0.2

    np.save(tmp_path / "short.npy", targets[:50])
    bad = ["--train-file", tmp_path / "pairs.tsv", "--output-dir", tmp_path / "bad", "--init-from", tiny_model_file]
    bad += ["--distill", tmp_path / "sentences.txt", tmp_path / "short.npy"]
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *map(str, bad)], capture_output=True, text=True)
    assert done.returncode == 2 and "short.npy: shape (50, 16), expected (200, 16)" in done.stderr


def test_relate_moves_the_cosines_toward_another_teachers(tiny_model_file, tmp_path):
    """--relate alone (vectors of another dimension than the model's) brings the model's cosine matrix of those
    sentences closer to that teacher's."""
    sentences, vectors = teacher_fixture(tmp_path, 14, 24)

    def relational(model_file):
        model = models.load_model(model_file)
        return float(
            train.relational_loss(torch.from_numpy(model.embed_raw_text(sentences)), torch.from_numpy(vectors))
        )

    args = ["--train-file", tmp_path / "pairs.tsv", "--output-dir", tmp_path / "run", "--init-from", tiny_model_file]
    args += ["--relate", tmp_path / "sentences.txt", tmp_path / "vectors.npy", "--margin-weight", "0"]
    args += ["--distill-batch-size", "50"]
    assert train.main([*map(str, args), "--max-steps", "60", "--megabatch-size", "1", "--lr", "0.05"]) == 0
    before, after = relational(tiny_model_file), relational(tmp_path / "run/model.pt")
    print(f"relational loss {before:.4f} before, {after:.4f} after")
    assert after < 0.8 * before


def test_contrastive_loss_matches_a_loop_over_sentences():
    """InfoNCE both ways, written out one sentence at a time: -log softmax of its own target's cosine / temperature
    among all targets, and the same for each target among all sentences."""
    vectors, targets, tau = torch.randn(7, 5), torch.randn(7, 5), 0.1
    cos = torch.nn.functional.cosine_similarity(vectors[:, None], targets[None], dim=2) / tau
    rows = [-(cos[i].softmax(0)[i]).log() for i in range(7)]
    columns = [-(cos[:, i].softmax(0)[i]).log() for i in range(7)]
    expected = (sum(rows) + sum(columns)) / 14
    assert float(train.contrastive_loss(vectors, targets, tau)) == pytest.approx(float(expected), rel=1e-5)
    assert train.contrastive_loss(targets * 3, targets, 0.01) < 1e-3  # each vector is its own target's nearest


def test_soft_contrastive_loss_matches_a_loop_over_sentences():
    """--distill-soft: the cross-entropy to the teachers' own distribution over the batch (their cosines / soft),
    written out one sentence at a time, both ways; a student equal to the targets beats one that is not."""
    vectors, targets, tau, soft = torch.randn(6, 5), torch.randn(6, 5), 0.1, 0.05
    cos = torch.nn.functional.cosine_similarity(vectors[:, None], targets[None], dim=2) / tau
    teach = torch.nn.functional.cosine_similarity(targets[:, None], targets[None], dim=2) / soft
    rows = [-(teach[i].softmax(0) * cos[i].log_softmax(0)).sum() for i in range(6)]
    columns = [-(teach[i].softmax(0) * cos[:, i].log_softmax(0)).sum() for i in range(6)]
    expected = (sum(rows) + sum(columns)) / 12
    assert float(train.contrastive_loss(vectors, targets, tau, soft)) == pytest.approx(float(expected), rel=1e-5)
    assert train.contrastive_loss(targets, targets, tau, soft) < train.contrastive_loss(vectors, targets, tau, soft)


def test_contrastive_distillation_ranks_each_sentence_nearest_its_target(tiny_model_file, tmp_path):
    """--distill-contrastive alone (no cosine loss) lowers the in-batch InfoNCE of the distilled sentences."""
    sentences, targets = teacher_fixture(tmp_path, 15, 16)

    def infonce(model_file):
        vectors = torch.from_numpy(models.load_model(model_file).embed_raw_text(sentences))
        return float(train.contrastive_loss(vectors, torch.from_numpy(targets), 0.1))

    args = ["--train-file", tmp_path / "pairs.tsv", "--output-dir", tmp_path / "run", "--init-from", tiny_model_file]
    args += ["--distill", tmp_path / "sentences.txt", tmp_path / "vectors.npy", "--margin-weight", "0"]
    args += ["--distill-weight", "0", "--distill-contrastive", "1", "--distill-batch-size", "50"]
    assert train.main([*map(str, args), "--max-steps", "60", "--megabatch-size", "1", "--lr", "0.05"]) == 0
    before, after = infonce(tiny_model_file), infonce(tmp_path / "run/model.pt")
    print(f"InfoNCE {before:.3f} before, {after:.3f} after")
    assert after < 0.8 * before


def test_nested_dims_bring_each_cut_nearer_its_targets_cut(tiny_model_file, tmp_path):
    """--nested-dims 4 8 adds the losses on each vector's first 4 and 8 values (toward the targets' first 4 and
    8): after the same updates, the cut vectors lie nearer the cut targets than a run without it leaves them; a K
    not below the dimension is refused."""
    sentences, targets = teacher_fixture(tmp_path, 16, 16)

    def cut_cosine(model_file, k):
        vectors = models.load_model(model_file).embed_raw_text(sentences)
        return float(static.cosine(vectors[:, :k], targets[:, :k]).mean())

    args = ["--train-file", tmp_path / "pairs.tsv", "--init-from", tiny_model_file, "--margin-weight", "0"]
    args += ["--distill", tmp_path / "sentences.txt", tmp_path / "vectors.npy", "--max-steps", "100"]
    args += ["--megabatch-size", "1", "--lr", "0.05", "--threads", "1"]
    assert train.main([*map(str, args), "--output-dir", str(tmp_path / "flat")]) == 0
    assert train.main([*map(str, args), "--output-dir", str(tmp_path / "nested"), "--nested-dims", "8", "4"]) == 0
    for k in (4, 8):
        flat, nested = cut_cosine(tmp_path / "flat/model.pt", k), cut_cosine(tmp_path / "nested/model.pt", k)
        print(f"first {k} values: cosine to the targets' {flat:.3f} without, {nested:.3f} with --nested-dims")
        assert nested > flat + 0.01
    assert resume.load_resume_state(tmp_path / "nested")["args"]["nested_dims"] == [4, 8]
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *map(str, args), "--output-dir", str(tmp_path / "bad")]
        + ["--nested-dims", "16"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--nested-dims 16: each must be below the dimension, 16" in done.stderr


def test_save_precision_int8_stores_a_quarter_and_the_run_still_resumes_exactly(pairs_file, sp_file, tmp_path):
    """--save-precision int8: model.pt holds int8 rows (within a step of the float32 table), resume.pt float32, so
    that a resumed run ends on the straight run's table."""
    straight = tiny_args(pairs_file, sp_file, tmp_path / "f32", "--max-steps", "6", "--dim", "64")
    assert train.main(straight) == 0
    short = tiny_args(
        pairs_file, sp_file, tmp_path / "i8", "--max-steps", "3", "--dim", "64", "--save-precision", "int8"
    )
    assert train.main(short) == 0
    assert train.main([*short[:-6], "--max-steps", "6", "--dim", "64", "--save-precision", "int8", "--resume"]) == 0
    exact = torch.load(tmp_path / "f32/model.pt", weights_only=True)["embedding"]
    stored = torch.load(tmp_path / "i8/model.pt", weights_only=True)
    assert stored["embedding"].dtype == torch.int8 and stored["embedding"].shape == exact.shape  # a quarter
    read = weights(tmp_path / "i8/model.pt")
    steps = exact.abs().amax(1, keepdim=True) / 127
    assert ((read - exact).abs() <= steps * 0.51 + 1e-6).all()  # the straight run's table, rounded to int8 steps


def test_relational_loss_is_zero_when_the_batch_cosines_match_the_teachers():
    """Only the batch's cosine matrix counts: a rotated and rescaled copy of the targets has the same one."""
    targets = torch.randn(12, 6)
    rotation = torch.linalg.qr(torch.randn(6, 6))[0]
    assert train.relational_loss(3 * targets @ rotation, targets) < 1e-10
    other = torch.randn(12, 6)
    s, t = torch.nn.functional.normalize(other, dim=1), torch.nn.functional.normalize(targets, dim=1)
    assert train.relational_loss(other, targets) == pytest.approx(float(((s @ s.T - t @ t.T) ** 2).mean()))


def test_neighbour_batches_hold_each_anchors_nearest_sentences_in_the_pool(tiny_model_file, tmp_path):
    """--distill-neighbours: a batch is its anchors, each followed by its nearest targets among the step's pool
    (checked against a loop over the pool), every sentence once; the same step gives the same batch."""
    sentences, targets = teacher_fixture(tmp_path, 16, 16)
    model = models.load_model(tiny_model_file)
    stream = train.DistillStream(
        model, tmp_path / "sentences.txt", tmp_path / "vectors.npy", 40, seed=3, neighbours=3, pool=60
    )
    assert stream.anchors == 10 and stream.per_pass == 20
    _, batch_targets = stream.batch(0, torch.device("cpu"))
    anchors = stream.order[1][:10]
    idx = stream.with_neighbours(anchors, 0)
    assert len(set(idx.tolist())) == len(idx) == len(batch_targets)
    assert torch.equal(batch_targets, stream.targets[idx])
    pool = np.random.default_rng((3, 0, 1)).choice(200, 60, replace=False)
    unit = targets / np.linalg.norm(targets, axis=1, keepdims=True)
    expected = []
    for a in anchors:
        near = sorted((j for j in pool if j != a), key=lambda j: -float(unit[a] @ unit[j]))[:3]
        expected += [a, *near]
    assert idx.tolist() == list(dict.fromkeys(int(i) for i in expected))


# ----------------------------------------------------------------------------- what a run tells its user


def test_a_run_says_why_it_stops_early_where_it_saved_and_leaves_no_lock(pairs_file, sp_file, tmp_path, capsys):
    out = tmp_path / "run"
    args = tiny_args(pairs_file, sp_file, out, "--epochs", "1", "--max-steps", "1000", "--megabatch-size", "1")
    assert train.main(args) == 0
    said = capsys.readouterr()
    err = said.out + said.err
    assert "updates (--epochs 1 end first)" in err
    assert f"saved {out / 'model.pt'}" in err
    assert not (out / ".lock").exists()


def test_a_smaller_vocabulary_than_asked_is_explained(pairs_file, tmp_path, capsys):
    args = tiny_args(pairs_file, "x", tmp_path / "run", "--max-steps", "1", "--vocab-size", "5000")
    args = args[:2] + args[4:]  # no --sp-model: one is trained on the pairs
    assert train.main(args) == 0
    assert "pieces, not the 5000 asked: the training text holds no more distinct pieces" in capsys.readouterr().out


def test_pairs_that_share_sentences_warn_against_large_mega_batches(sp_file, tmp_path, capsys):
    groups = [generated_sentences(4, seed=k) for k in range(60)]  # 4 paraphrases a group, all 6 pairs of each
    lines = [f"{g[i]}\t{g[j]}" for g in groups for i in range(4) for j in range(i + 1, 4)]
    pairs = tmp_path / "groups.tsv"
    pairs.write_text("\n".join(lines) + "\n")
    assert train.main(tiny_args(pairs, sp_file, tmp_path / "a", "--max-steps", "1")) == 0
    assert "consider --megabatch-size 1" in capsys.readouterr().out
    assert train.main(tiny_args(pairs, sp_file, tmp_path / "b", "--max-steps", "1", "--megabatch-size", "1")) == 0
    assert "consider --megabatch-size 1" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- the GPU's step, run on the CPU


def test_distinct_rows_in_fixed_slots_match_torch_unique_and_leave_the_padding_out():
    ids = torch.tensor([7, 3, 7, 9, 3, 3, 0, 12, 20, 20])  # the last two: padding of the spare row, 20
    distinct = cuda_step.distinct_rows(ids, spare=20, size=8, real=torch.tensor(8))
    want_rows, want_local = torch.unique(ids[:8], return_inverse=True)
    assert torch.equal(distinct.rows[:5], want_rows) and (distinct.rows[5:] == 20).all()
    assert torch.equal(distinct.local[:8], want_local) and torch.equal(distinct.rows[distinct.local], ids)
    runs = [distinct.order[a:b].tolist() for a, b in zip(distinct.starts[:-1], distinct.starts[1:], strict=True)]
    assert runs == [[6], [1, 4, 5], [0, 2], [3], [7], [], [], []]  # the padding's slot is empty: it adds nothing


def test_slots_hold_every_count_with_at_most_an_eighth_of_filler_in_few_shapes():
    sizes = [cuda_step.slots(n) for n in range(1, 70_000)]
    assert all(n <= size <= max(n * 9 // 8, n + 1) for n, size in enumerate(sizes, 1))
    assert len(set(sizes[4096:8192])) <= 9  # eight shapes an octave


def test_segment_mean_is_embedding_bags_mean_with_the_same_gradient():
    table = torch.randn(31, 8, dtype=torch.float64, requires_grad=True)  # row 30: the spare
    ids, offsets = torch.tensor([1, 5, 5, 2, 29, 0, 3, 30, 30]), torch.tensor([0, 3, 4, 4])  # an empty bag scores 0
    distinct = cuda_step.distinct_rows(ids, spare=30, size=9, real=torch.tensor(7))  # two ids of padding, unread
    got = cuda_step.segment_mean(table.index_select(0, distinct.rows), distinct, torch.tensor([0, 3, 4, 4, 7]))
    want = models.mean_pool(table, ids[:7], offsets)
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got.sum(), table)
    (g2,) = torch.autograd.grad(want.sum(), table)
    torch.testing.assert_close(g1, g2)


def test_segment_mean_with_dropout_has_the_gradient_of_its_own_mask():
    sub = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)  # row 5: the spare
    ids = torch.tensor([1, 4, 4, 2, 0, 3, 1, 5])
    distinct = cuda_step.distinct_rows(ids, spare=5, size=6, real=torch.tensor(7))
    bounds = torch.tensor([0, 3, 3, 7])
    torch.manual_seed(3)
    got = cuda_step.segment_mean(sub.index_select(0, distinct.rows), distinct, bounds, dropout=0.5)
    (g1,) = torch.autograd.grad((got * torch.arange(8.0)).sum(), sub)
    torch.manual_seed(3)  # the same mask, drawn by the same kernel, through autograd's own dropout gradient
    rows, _ = torch.native_dropout(sub.index_select(0, distinct.rows).index_select(0, distinct.local), 0.5, True)
    want = torch.segment_reduce(rows, "sum", offsets=bounds, unsafe=True) / torch.tensor([3.0, 1.0, 4.0])[:, None]
    (g2,) = torch.autograd.grad((want * torch.arange(8.0)).sum(), sub)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g1, g2)


def test_the_step_that_never_waits_trains_as_the_other_does(pairs_file, sp_file, tmp_path, monkeypatch):
    """The GPU's step (fixed-size rows, gather and index_add pooling, flags and Adam's step count on the device):
    a CPU run of it ends near the usual step's weights (the sums' order differs), its padded form (what a CUDA graph
    records) gives the unpadded one's weights exactly, and a kill and --resume of it ends where the uninterrupted
    run does."""
    common = ["--max-steps", "30", "--save-every", "7"]
    assert train.main(tiny_args(pairs_file, sp_file, tmp_path / "usual", *common)) == 0
    monkeypatch.setattr(train, "SYNC_FREE_ON_CPU", True)
    assert train.main(tiny_args(pairs_file, sp_file, tmp_path / "free", *common)) == 0
    usual, free = weights(tmp_path / "usual" / "model.pt"), weights(tmp_path / "free" / "model.pt")
    torch.testing.assert_close(free, usual, atol=1e-4, rtol=1e-4)
    state = torch.load(tmp_path / "free" / "resume.pt", weights_only=True)
    assert state["optimizer"]["moments"].shape[1] == free.shape[0]  # the spare row is never saved
    assert state["optimizer"]["steps"] == 30
    last = json.loads((tmp_path / "free" / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0 < last["shapes"] <= 30 and 0 < last["seconds_record"] <= last["seconds_update"]  # bench_gpu's split
    with monkeypatch.context() as eager:  # the padded fixed-shape step a CUDA graph records, against the plain one
        eager.setattr(train.GraphedSteps, "step", lambda *args: None)
        assert train.main(tiny_args(pairs_file, sp_file, tmp_path / "eager", *common)) == 0
    assert torch.equal(weights(tmp_path / "eager" / "model.pt"), free)
    stop = lambda t: t.step == 12 and setattr(t, "stop_requested", True)  # noqa: E731 (Ctrl-C after update 12)
    out = tmp_path / "again"
    assert train.main(tiny_args(pairs_file, sp_file, out, *common), on_step=stop) == 130
    assert train.main(tiny_args(pairs_file, sp_file, out, *common, "--resume")) == 0
    assert torch.equal(weights(out / "model.pt"), free)


def test_a_resume_continues_with_the_thread_count_of_its_run(pairs_file, sp_file, tmp_path, monkeypatch):
    """A CPU's sums depend on the thread count, and with no --threads the count follows the machine's load: a resume
    given none continues with the count its run started with, so it ends where the uninterrupted run does however
    busy the machine was at either moment."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: every run has one thread")
    args = tiny_args(pairs_file, sp_file, tmp_path / "killed", "--max-steps", "12", "--save-every", "4")
    args = args[: args.index("--threads")] + args[args.index("--threads") + 2 :]  # the default: the idle cores
    monkeypatch.setattr(workers, "busy_cores", lambda: cores - 1)  # a busy machine: one thread
    stop = lambda t: t.step == 6 and setattr(t, "stop_requested", True)  # noqa: E731
    assert train.main(args, on_step=stop) == 130
    monkeypatch.setattr(workers, "busy_cores", lambda: 0)  # idle now: the default would be every core
    seen = []
    assert train.main([*args, "--resume"], on_step=lambda t: seen.append(torch.get_num_threads())) == 0
    assert set(seen) == {1}
    straight = tiny_args(pairs_file, sp_file, tmp_path / "straight", "--max-steps", "12", "--save-every", "4")
    assert train.main(straight) == 0  # --threads 1
    assert torch.equal(weights(tmp_path / "killed" / "model.pt"), weights(tmp_path / "straight" / "model.pt"))


def nan_loss_at(call: int):
    """margin_loss, but NaN at its `call`-th call (one update's loss)."""
    calls, real = [0], train.margin_loss

    def margin_loss(*args, **kwargs):
        calls[0] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls[0] == call else loss

    return margin_loss


def test_a_non_finite_update_is_masked_on_the_device(pairs_file, sp_file, tmp_path, monkeypatch, capsys):
    common = ["--max-steps", "12", "--save-every", "4", "--on-nan", "skip"]
    monkeypatch.setattr(train, "margin_loss", nan_loss_at(6))
    assert train.main(tiny_args(pairs_file, sp_file, tmp_path / "usual", *common)) == 0
    monkeypatch.setattr(train, "margin_loss", nan_loss_at(6))
    monkeypatch.setattr(train, "SYNC_FREE_ON_CPU", True)
    assert train.main(tiny_args(pairs_file, sp_file, tmp_path / "free", *common)) == 0
    said = capsys.readouterr()
    assert "1 update(s) up to update 8 had a non-finite loss or gradient and were not applied" in said.err  # a save
    for run in ("usual", "free"):
        assert torch.load(tmp_path / run / "resume.pt", weights_only=True)["skipped"] == 1
    torch.testing.assert_close(weights(tmp_path / "free" / "model.pt"), weights(tmp_path / "usual" / "model.pt"))
    monkeypatch.setattr(train, "margin_loss", nan_loss_at(6))
    stop = tiny_args(pairs_file, sp_file, tmp_path / "stop", "--max-steps", "12", "--save-every", "4")
    assert train.main(stop) == 3  # --on-nan stop: found at the next save (update 8), which is not made
    assert torch.load(tmp_path / "stop" / "resume.pt", weights_only=True)["position"]["step"] == 4
    assert "were not applied" in capsys.readouterr().err


def test_many_copies_of_one_pair_mine_in_bounded_memory():
    """4,096 copies of one pair in a mega-batch: listing their forbidden pairs would take 8,192^2 entries; by
    group they are compared block by block, and nothing can be a negative."""
    n = 4_096
    ids, offsets = torch.tensor([5, 6, 7] * (2 * n)), torch.arange(0, 6 * n, 3)
    groups = negatives.sentence_groups(ids, offsets)
    assert int(groups.max()) == 0
    vectors = torch.randn(2 * n, 8, generator=torch.Generator().manual_seed(0))
    assert (negatives.mine_hardest(vectors, groups, bitext=False) == -1).all()
