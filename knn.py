"""Nearest neighbours by cosine: exact in torch, or with a faiss index (exact, or IVF for large sets) where
faiss is installed (the `mine` extra). Shared by evaluate.py's Tatoeba retrieval and mine_bitext.py. torch is
imported by the functions that search, so that the commands above start (and answer --help) without it."""

from __future__ import annotations

import importlib.util
import math

import numpy as np

FAISS_HINT = 'pip install faiss-cpu (or: pip install "paraphrastic[mine]")'


def have_faiss() -> bool:
    return importlib.util.find_spec("faiss") is not None


def set_faiss_threads(threads: int) -> None:
    """faiss's OpenMP threads (a no-op without faiss)."""
    if have_faiss():
        import faiss  # the optional extra, imported only where it is installed

        faiss.omp_set_num_threads(threads)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as contiguous float32."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return torch.nn.functional.normalize(t, dim=1).numpy()


def exact_topk(keys: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest inner products of each query against all keys and their rows, in torch."""
    import torch

    sims, ids = torch.topk(torch.from_numpy(queries) @ torch.from_numpy(keys).T, k, dim=1)
    return sims.numpy(), ids.numpy()


def faiss_index(dim: int, kind: str = "flat", nlist: int = 1, nprobe: int = 1, sample: np.ndarray | None = None):
    """An empty faiss inner-product index: exact ("flat"), or IVF with `nlist` lists trained on `sample`."""
    import faiss  # the optional extra: callers check have_faiss() first

    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(sample)
    index.nprobe = min(nprobe, nlist)
    return index


def nearest_both_ways(
    a: np.ndarray, b: np.ndarray, chunk: int = 4096, faiss_from: int = 100_000
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest row of `b` for each row of `a` and of `a` for each row of `b`, by cosine (ties: lowest row).

    Exact: one chunked pass of a @ b.T serves both directions; with faiss installed, sets of `faiss_from`
    rows or more use an exact faiss index instead.
    """
    import torch

    a, b = unit_rows(a), unit_rows(b)
    if max(len(a), len(b)) >= faiss_from and have_faiss():
        return tuple(faiss_nearest(keys, queries) for keys, queries in ((b, a), (a, b)))
    a, b = torch.from_numpy(a), torch.from_numpy(b)
    a_to_b = torch.empty(len(a), dtype=torch.long)
    best = torch.full((len(b),), -math.inf)
    b_to_a = torch.zeros(len(b), dtype=torch.long)
    for i in range(0, len(a), chunk):
        sim = a[i : i + chunk] @ b.T
        a_to_b[i : i + chunk] = sim.argmax(dim=1)
        top, row = sim.max(dim=0)
        better = top > best  # strict: an earlier chunk keeps a tie
        best = torch.where(better, top, best)
        b_to_a = torch.where(better, row + i, b_to_a)
    return a_to_b.numpy(), b_to_a.numpy()


def faiss_nearest(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Row of each query's nearest key by inner product, with an exact faiss index."""
    index = faiss_index(keys.shape[1])
    index.add(keys)
    return index.search(queries, 1)[1][:, 0].astype(np.int64)
