"""paraphrastic: fast paraphrastic sentence embeddings (the SP model: mean of sentencepiece embeddings).

    import paraphrastic
    model = paraphrastic.load_model()            # the shipped English model (torch: train it, move it to a GPU)
    model.encode(["A man plays guitar.", "Someone plays a guitar."])
    paraphrastic.load_encoder()                  # the same vectors, without importing torch (a faster start)

The repository's top-level files are this package's modules: `paraphrastic.models`, `paraphrastic.train`, ...
"""

import os
import sys

from paraphrastic import workers
from paraphrastic.checkpoint import read_checkpoint, static_from_checkpoint
from paraphrastic.static import Encoding, existing_model

__version__ = "0.2.0"
__all__ = ["load_encoder", "load_model", "__version__"]


def load_encoder(path: str | os.PathLike | None = None, sp_model=None, device: str | None = None) -> Encoding:
    """The model to embed with: an SPEncoder where it can be one (our SP checkpoint, on the CPU), read without
    torch; anything else (other layouts, other encoders, a GPU, a file the torch-free reader does not take) through
    models.load_model. It lives here, above both readers, so that the torch-free one never imports the torch one."""
    if sp_model is None and device in (None, "cpu"):
        file = existing_model(path)
        state = read_checkpoint(file)
        if state is not None and (model := static_from_checkpoint(state, file)) is not None:
            return model
    threads = workers.threads()
    from paraphrastic.models import load_model

    sys.modules["torch"].set_num_threads(threads)  # torch, imported just now, follows --threads too
    return load_model(path, sp_model=sp_model, device=device)


def __getattr__(name: str):
    """`load_model` imports torch, so only when asked for: the commands that only embed start without it."""
    if name == "load_model":
        from paraphrastic.models import load_model

        return load_model
    raise AttributeError(f"module 'paraphrastic' has no attribute {name!r}")
