"""Console entry points whose run needs torch: the options are read first (--help answered, a mistaken one refused
in 0.1 s), and the modules a run needs are imported only then (torch alone takes 1 s). Here, not in those modules:
they import the option tables, so the tables cannot import them back."""

from __future__ import annotations

from paraphrastic.train_config import parse_args


def train(argv: list[str] | None = None) -> int:
    """paraphrastic-train."""
    parse_args(argv)
    from paraphrastic import train as trainer

    return trainer.main(argv)
