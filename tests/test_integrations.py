"""The model inside LangChain, LlamaIndex and Chroma (the `.[integrations]` extra): 1,000 documents embedded
through our adapters, and through an exported folder where the library loads folders, answer a query with the
scores `model.similarity` gives."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys

import numpy as np
import pytest
from conftest import generated_sentences, need

from paraphrastic import integrations, interop, load_encoder

DOCS = generated_sentences(1000, seed=21)
QUERY = DOCS[17].lower()  # a document of its own, so the best hit is known


@pytest.fixture(scope="module")
def model():
    return load_encoder()


@pytest.fixture(scope="module")
def folder(model, tmp_path_factory):
    need("sentence_transformers")
    return interop.export_folder(model, tmp_path_factory.mktemp("export") / "model")


def expected(model, texts) -> np.ndarray:
    return model.similarity([QUERY], texts)[0]


def check_hits(model, hits: list[tuple[str, float]]) -> None:
    """The query's hits: the document it was made from first, each score the model's cosine within 1e-5."""
    assert len(hits) == 5 and hits[0][0] == DOCS[17]
    texts, scores = zip(*hits, strict=True)
    np.testing.assert_allclose(scores, expected(model, list(texts)), atol=1e-5)


def test_importing_the_module_imports_no_library():
    code = "import sys, paraphrastic.integrations; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert not {"langchain_core", "llama_index", "chromadb", "torch"} & set(ast.literal_eval(loaded))
    with pytest.raises(AttributeError):
        integrations.Nothing  # noqa: B018


def test_langchain_store_through_the_adapter_and_the_exported_folder(model, folder):
    need("langchain_core")
    from langchain_core.vectorstores import InMemoryVectorStore

    store = InMemoryVectorStore.from_texts(DOCS, integrations.LangChainEmbeddings())
    check_hits(model, [(d.page_content, s) for d, s in store.similarity_search_with_score(QUERY, k=5)])
    vectors = np.array(integrations.LangChainEmbeddings(model).embed_documents(DOCS[:3]))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)

    need("langchain_huggingface")
    from langchain_huggingface import HuggingFaceEmbeddings

    store = InMemoryVectorStore.from_texts(DOCS, HuggingFaceEmbeddings(model_name=str(folder)))
    check_hits(model, [(d.page_content, s) for d, s in store.similarity_search_with_score(QUERY, k=5)])


def test_llama_index_retriever_through_the_adapter(model, folder):
    need("llama_index.core")
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    embed = integrations.LlamaIndexEmbedding(embed_batch_size=256)
    index = VectorStoreIndex([TextNode(text=d, id_=str(i)) for i, d in enumerate(DOCS)], embed_model=embed)
    hits = index.as_retriever(similarity_top_k=5).retrieve(QUERY)
    check_hits(model, [(h.node.get_content(), h.score) for h in hits])
    np.testing.assert_allclose(asyncio.run(embed.aget_query_embedding(QUERY)), embed.get_query_embedding(QUERY))

    need("llama_index.embeddings.huggingface")
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    with pytest.raises(Exception, match="max_length"):  # as integrations.py says; the day it loads, say so there
        HuggingFaceEmbedding(model_name=str(folder), device="cpu")


def test_chroma_collection_through_the_adapter_and_the_exported_folder(model, folder, tmp_path):
    need("chromadb")
    import chromadb
    from chromadb.utils.embedding_functions import SentenceTransformerEmbeddingFunction

    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    for name, function in [
        ("ours", integrations.ChromaEmbeddingFunction()),
        ("folder", SentenceTransformerEmbeddingFunction(model_name=str(folder), device="cpu")),
    ]:
        space = {} if name == "ours" else {"hnsw:space": "cosine"}  # ours says cosine itself
        collection = client.create_collection(name, embedding_function=function, metadata=space or None)
        for start in range(0, len(DOCS), 250):
            collection.add(ids=[str(i) for i in range(start, start + 250)], documents=DOCS[start : start + 250])
        found = collection.query(query_texts=[QUERY], n_results=5)
        check_hits(model, [(d, 1 - s) for d, s in zip(found["documents"][0], found["distances"][0], strict=True)])
    reopened = chromadb.PersistentClient(path=str(tmp_path / "chroma")).get_collection("ours")
    assert reopened.query(query_texts=[QUERY], n_results=1)["documents"][0] == [DOCS[17]]  # rebuilt from its config
