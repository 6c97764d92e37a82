"""paraphrastic: fast paraphrastic sentence embeddings (the SP model: mean of sentencepiece embeddings).

    import paraphrastic
    model = paraphrastic.load_model()            # the shipped English model (torch: train it, move it to a GPU)
    model.encode(["A man plays guitar.", "Someone plays a guitar."])
    paraphrastic.load_encoder()                  # the same vectors, without importing torch (a faster start)

The repository's top-level files are this package's modules: `paraphrastic.models`, `paraphrastic.train`, ...
"""

from paraphrastic.static import load_encoder

__version__ = "0.2.0"
__all__ = ["load_encoder", "load_model", "__version__"]


def __getattr__(name: str):
    """`load_model` imports torch, so only when asked for: the commands that only embed start without it."""
    if name == "load_model":
        from paraphrastic.models import load_model

        return load_model
    raise AttributeError(f"module 'paraphrastic' has no attribute {name!r}")
