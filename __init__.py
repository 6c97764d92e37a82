"""paraphrastic: fast paraphrastic sentence embeddings (the SP model: mean of sentencepiece embeddings).

    import paraphrastic
    model = paraphrastic.load_model()            # the shipped English model
    model.encode(["A man plays guitar.", "Someone plays a guitar."])

The repository's top-level files are this package's modules: `paraphrastic.models`, `paraphrastic.train`, ...
"""

from paraphrastic.models import load_model

__version__ = "0.2.0"
__all__ = ["load_model", "__version__"]
