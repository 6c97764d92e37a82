"""paraphrastic: fast paraphrastic sentence embeddings (the SP model: mean of sentencepiece embeddings).

    import paraphrastic
    model = paraphrastic.load_model()            # the shipped English model (torch: train it, move it to a GPU)
    model.encode(["A man plays guitar.", "Someone plays a guitar."])
    paraphrastic.load_encoder()                  # the same vectors, without importing torch (a faster start)

The repository's top-level files are this package's modules: `paraphrastic.models`, `paraphrastic.train`, ...
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paraphrastic.static import Encoding

__version__ = "0.2.0"
__all__ = ["load_encoder", "load_model", "__version__"]


def load_encoder(path: str | os.PathLike | None = None, sp_model=None, device: str | None = None) -> Encoding:
    """The model to embed with: an SPEncoder where it can be one (our SP checkpoint, on the CPU), read without
    torch; anything else (other layouts, other encoders, a GPU, a file the torch-free reader does not take) through
    models.load_model. It lives here, above both readers, so that the torch-free one never imports the torch one;
    its imports are made here, so that `import paraphrastic.X` costs no numpy where X needs none (train's and the
    demo's --help)."""
    from paraphrastic import workers
    from paraphrastic.checkpoint import read_checkpoint, static_from_checkpoint
    from paraphrastic.static import existing_model

    if sp_model is None and device in (None, "cpu"):
        file, early = existing_model(path), []  # the tokenizer, started in a thread as the file is read
        try:
            state = read_checkpoint(file, early)
            if state is not None and (model := static_from_checkpoint(state, file, *early)) is not None:
                return model
        finally:
            for thread in early:  # nothing of it outlives the call, whatever the file turned out to be
                thread.join()
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
