"""The seed papers' encoders beside SP: word and trigram tokens, LSTM/BLSTM/GRAN pooling, and parts joined."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from paraphrastic.fileio import ModelError
from paraphrastic.pieces import cased

POOLINGS = ("mean", "lstm", "blstm", "gran")
COMBINE = ("add", "concat")


class WordTokenizer:
    """Whitespace tokens (after lowercasing) looked up in a vocabulary; id 0 is the unknown word."""

    kind = "word"
    unk_id = 0

    def __init__(self, vocab: Sequence[str], lowercase: bool = True):
        self.vocab, self.lowercase = list(vocab), lowercase
        self.index = {w: i for i, w in enumerate(self.vocab, start=1)}

    def __len__(self) -> int:
        return len(self.vocab) + 1

    def encode_flat(self, texts: Sequence[str], num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(flat ids, per-text lengths) of a batch; words outside the vocabulary get id 0."""
        tokens = list(map(str.split, cased(texts, self.lowercase)))
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        words = itertools.chain.from_iterable(tokens)
        flat = np.fromiter(map(self.index.get, words, itertools.repeat(0)), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths

    @staticmethod
    def count(texts: Sequence[str], counts: Counter, lowercase: bool = True) -> None:
        """Add the word counts of `texts` to `counts` (for building a vocabulary)."""
        counts.update(itertools.chain.from_iterable(map(str.split, cased(texts, lowercase))))


def trigram_keys(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Character trigrams of each text padded with one space at each end, as int64 keys (three 21-bit
    code points), and the number of trigrams per text (its length in characters)."""
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    padded = (" " + "  ".join(texts) + " ").encode("utf-32-le", "surrogatepass")
    codes = np.frombuffer(padded, dtype=np.uint32).astype(np.int64)
    starts = np.arange(int(lengths.sum())) + 2 * np.repeat(np.arange(len(texts)), lengths)
    return (codes[starts] << 42) | (codes[starts + 1] << 21) | codes[starts + 2], lengths


def trigram_text(key: int) -> str:
    """The three characters of a trigram key."""
    return "".join(chr((key >> shift) & 0x1FFFFF) for shift in (42, 21, 0))


class TrigramTokenizer:
    """Character trigrams of the text padded with one space at each end; id 0 is the unknown trigram."""

    kind = "trigram"
    unk_id = 0

    def __init__(self, vocab: Sequence[str], lowercase: bool = True):
        self.vocab, self.lowercase = list(vocab), lowercase
        if any(len(v) != 3 for v in self.vocab):
            raise ModelError("a trigram vocabulary entry is not three characters long")
        codes = np.frombuffer("".join(self.vocab).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        keys = codes.astype(np.int64).reshape(-1, 3) @ np.array([1 << 42, 1 << 21, 1], dtype=np.int64)
        self.order = np.argsort(keys)
        self.keys = keys[self.order]

    def __len__(self) -> int:
        return len(self.vocab) + 1

    def encode_flat(self, texts: Sequence[str], num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(flat ids, per-text lengths) of a batch; trigrams outside the vocabulary get id 0."""
        keys, lengths = trigram_keys(cased(texts, self.lowercase))
        pos = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        found = self.keys[pos] == keys if len(self.keys) else np.zeros(len(keys), dtype=bool)
        return np.where(found, self.order[pos] + 1, 0), lengths

    @staticmethod
    def count(texts: Sequence[str], counts: Counter, lowercase: bool = True) -> None:
        """Add the trigram counts of `texts` to `counts` (keys as in trigram_keys)."""
        keys, counts_here = np.unique(trigram_keys(cased(texts, lowercase))[0], return_counts=True)
        counts.update(dict(zip(keys.tolist(), counts_here.tolist(), strict=True)))


TOKENIZERS = {"word": WordTokenizer, "trigram": TrigramTokenizer}


def build_vocab(kind: str, chunks: Iterable[Sequence[str]], max_types: int, lowercase: bool = True) -> list[str]:
    """The `max_types` most frequent words or trigrams of the text chunks (ties broken by the type)."""
    counts: Counter = Counter()
    for texts in chunks:
        TOKENIZERS[kind].count(texts, counts, lowercase)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max_types]
    return [trigram_text(k) if kind == "trigram" else k for k, _ in ranked]


def interleave(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Join per-part (flat ids, lengths) sentence by sentence: each sentence's part-0 ids, then part 1's..."""
    lengths = np.sum([lens for _, lens in parts], axis=0)
    flat = np.empty(int(lengths.sum()), dtype=np.int64)
    before = np.cumsum(lengths) - lengths  # where each sentence's ids start, then moved past each part in turn
    for ids, lens in parts:
        flat[np.repeat(before - (np.cumsum(lens) - lens), lens) + np.arange(len(ids))] = ids
        before = before + lens
    return flat, lengths


def deinterleave(
    ids: torch.Tensor, offsets: torch.Tensor, starts: np.ndarray
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each part's (rows, offsets) out of bags joined by `interleave`, in order within each bag; part k
    owns the table rows [starts[k], starts[k + 1])."""
    owner = bag_owners(len(ids), offsets)[1]
    out = []
    for lo, hi in itertools.pairwise(starts.tolist()):
        mine = (ids >= lo) & (ids < hi)
        counts = torch.bincount(owner[mine], minlength=len(offsets))
        out.append((ids[mine], torch.cumsum(counts, 0) - counts))
    return out


def bag_owners(count: int, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each bag's length and each of the `count` ids' bag, from the bags' start offsets."""
    lengths = torch.diff(offsets, append=offsets.new_tensor([count]))
    return lengths, torch.repeat_interleave(torch.arange(len(offsets), device=offsets.device), lengths)


def combined(vectors: list[torch.Tensor], combine: str) -> torch.Tensor:
    """The parts' sentence vectors made one: concatenated ('concat') or added ('add')."""
    return torch.cat(vectors, dim=1) if combine == "concat" else torch.stack(vectors).sum(0)


def recurrent_layer(pooling: str, width: int) -> nn.Module:
    """The weights of a recurrent pooling: a GRAN, or an LSTM (bidirectional for 'blstm')."""
    if pooling == "gran":
        return Gran(width)
    return nn.LSTM(width, width, batch_first=True, bidirectional=pooling == "blstm")


def recurrent_pool(
    layer: nn.Module, table: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """Sentence vectors of a recurrent part: its rows of `table` (dropped out with `dropout` > 0, in
    training) read by a GRAN, or by an LSTM whose hidden states are averaged."""
    rows = F.dropout(table.index_select(0, ids), p=dropout, training=dropout > 0)
    return layer(rows, offsets) if isinstance(layer, Gran) else lstm_pool(layer, rows, offsets)


def lstm_states(
    lstm: nn.LSTM, rows: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the LSTM over each bag's rows in order: (padded inputs, hidden states, lengths), both
    (bags, steps, dim) with zeros past each bag's end; a bidirectional LSTM's two directions are averaged."""
    lengths, owner = bag_owners(len(rows), offsets)
    bags, steps = len(offsets), int(lengths.max())
    slot = owner * steps + torch.arange(len(rows), device=rows.device) - offsets[owner]
    padded = rows.new_zeros(bags * steps, rows.shape[1]).index_copy(0, slot, rows).view(bags, steps, -1)
    packed = nn.utils.rnn.pack_padded_sequence(padded, lengths.cpu(), batch_first=True, enforce_sorted=False)
    states = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=steps)[0]
    if lstm.bidirectional:
        states = (states[..., : lstm.hidden_size] + states[..., lstm.hidden_size :]) / 2
    return padded, states, lengths


def lstm_pool(lstm: nn.LSTM, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The mean of the LSTM's hidden states over each bag's rows (the seed papers' LSTM and BLSTM)."""
    _, states, lengths = lstm_states(lstm, rows, offsets)
    return states.sum(1) / lengths.unsqueeze(1).to(states.dtype)


class Gran(nn.Module):
    """The gated recurrent averaging network (Wieting & Gimpel 2017): an LSTM reads the embeddings x_t,
    each token contributes a_t = x_t * sigmoid(W_x x_t + W_h h_t + b), and the sentence is the mean of
    the a_t. With the gate at 1 it is AVG; the LSTM only decides how much of each token to keep."""

    def __init__(self, width: int):
        super().__init__()
        self.lstm = nn.LSTM(width, width, batch_first=True)
        self.gate = nn.Linear(2 * width, width)  # [W_x W_h] on [x_t; h_t], plus b

    def forward(self, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        x, h, lengths = lstm_states(self.lstm, rows, offsets)
        kept = x * torch.sigmoid(self.gate(torch.cat([x, h], dim=-1)))  # padding stays 0: x is 0 there
        return kept.sum(1) / lengths.unsqueeze(1).to(kept.dtype)
