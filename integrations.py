"""Our models inside the libraries people build on: a LangChain `Embeddings`, a LlamaIndex `BaseEmbedding` and a
Chroma `EmbeddingFunction`, each embedding with `load_encoder` (no torch) and giving unit rows, so that a vector
store's cosine, dot product or L2 ranks as `model.similarity` does.

    from paraphrastic.integrations import LangChainEmbeddings, LlamaIndexEmbedding, ChromaEmbeddingFunction
    store = InMemoryVectorStore(LangChainEmbeddings())                  # langchain-core
    index = VectorStoreIndex(nodes, embed_model=LlamaIndexEmbedding())  # llama-index-core
    client.create_collection("docs", embedding_function=ChromaEmbeddingFunction("multilingual"))

Each class is built on first use, so that importing this module imports none of those libraries. LlamaIndex's own
`HuggingFaceEmbedding(model_name=folder)` cannot load an exported folder: it stores the model's `max_seq_length` in
an integer field and sets it when given `max_length`, while a static embedding reads every piece (its
`max_seq_length` is inf and cannot be set, in sentence-transformers' `StaticEmbedding` as in ours); use
`LlamaIndexEmbedding` there. LangChain's `HuggingFaceEmbeddings(model_name=folder)` and Chroma's
`SentenceTransformerEmbeddingFunction(model_name=folder)` load exported folders as they are.
"""

from __future__ import annotations

import os
from typing import Any

from paraphrastic import load_encoder
from paraphrastic.fileio import InputError

DEFAULT = "default"


def _model(model: Any):
    """A model name or path loaded with `load_encoder`; a loaded model as it is."""
    return load_encoder(model) if model is None or isinstance(model, (str, os.PathLike)) else model


def _name(model: Any) -> str:
    return str(model) if isinstance(model, (str, os.PathLike)) else DEFAULT if model is None else type(model).__name__


def _rows(model, texts) -> list[list[float]]:
    return model.encode(list(texts), normalize_embeddings=True).tolist()


def _needs(module: str, package: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise InputError(f"this adapter needs {package}: pip install {package}") from None


def _langchain() -> type:
    _needs("langchain_core", "langchain-core")
    from langchain_core.embeddings import Embeddings

    class LangChainEmbeddings(Embeddings):
        """A LangChain `Embeddings` of a paraphrastic model (a name, a path or a loaded model)."""

        def __init__(self, model: Any = DEFAULT):
            self.model, self.model_name = _model(model), _name(model)

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return _rows(self.model, texts)

        def embed_query(self, text: str) -> list[float]:
            return _rows(self.model, [text])[0]

    return LangChainEmbeddings


def _llama_index() -> type:
    _needs("llama_index.core", "llama-index-core")
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from pydantic import PrivateAttr

    class LlamaIndexEmbedding(BaseEmbedding):
        """A LlamaIndex `BaseEmbedding` of a paraphrastic model (a name, a path or a loaded model); other keywords
        are BaseEmbedding's (`embed_batch_size`, `callback_manager`)."""

        _model: Any = PrivateAttr()

        def __init__(self, model: Any = DEFAULT, **kwargs: Any):
            super().__init__(model_name=_name(model), **kwargs)
            self._model = _model(model)

        @classmethod
        def class_name(cls) -> str:
            return "ParaphrasticEmbedding"

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return _rows(self._model, texts)

        def _get_text_embedding(self, text: str) -> list[float]:
            return _rows(self._model, [text])[0]

        def _get_query_embedding(self, query: str) -> list[float]:
            return _rows(self._model, [query])[0]

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

    return LlamaIndexEmbedding


def _chroma() -> type:
    _needs("chromadb", "chromadb")
    from chromadb.api.types import Documents, EmbeddingFunction, Embeddings
    from chromadb.utils.embedding_functions import register_embedding_function

    @register_embedding_function
    class ChromaEmbeddingFunction(EmbeddingFunction[Documents]):
        """A Chroma `EmbeddingFunction` of a paraphrastic model (a name or a path, kept in the collection's
        config so that Chroma rebuilds it when the collection is opened again; or a loaded model)."""

        def __init__(self, model: Any = DEFAULT):
            self.model, self.model_name = _model(model), _name(model)

        def __call__(self, input: Documents) -> Embeddings:
            return list(self.model.encode(list(input), normalize_embeddings=True))

        @staticmethod
        def name() -> str:
            return "paraphrastic"

        def get_config(self) -> dict[str, Any]:
            return {"model": self.model_name}

        @staticmethod
        def build_from_config(config: dict[str, Any]) -> ChromaEmbeddingFunction:
            return ChromaEmbeddingFunction(config["model"])

        def default_space(self) -> str:
            return "cosine"

    return ChromaEmbeddingFunction


_BUILDERS = {"LangChainEmbeddings": _langchain, "LlamaIndexEmbedding": _llama_index, "ChromaEmbeddingFunction": _chroma}


def __getattr__(name: str) -> type:
    """The adapter classes, each built (and its library imported) when first asked for."""
    if name not in _BUILDERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = globals()[name] = _BUILDERS[name]()
    return cls
