"""The console commands' entry points: each reads its options first (options.py, train_config.py: argparse and no
numpy), so that --help and a mistaken option answer in a few hundredths of a second, and imports the module that
does the work (numpy, torch, gradio: 0.1-1 s) only then."""

from __future__ import annotations

from paraphrastic.options import demo_args, embed_args, evaluate_args, export_args, mine_args, score_args


def embed(argv: list[str] | None = None) -> int:
    """paraphrastic-embed."""
    embed_args(argv)
    from paraphrastic import embed_sentences

    return embed_sentences.main(argv)


def score(argv: list[str] | None = None) -> int:
    """paraphrastic-score."""
    score_args(argv)
    from paraphrastic import score_sentence_pairs

    return score_sentence_pairs.main(argv)


def mine(argv: list[str] | None = None) -> int:
    """paraphrastic-mine."""
    mine_args(argv)
    from paraphrastic import mine_bitext

    return mine_bitext.main(argv)


def evaluate(argv: list[str] | None = None) -> int:
    """paraphrastic-evaluate."""
    evaluate_args(argv)
    from paraphrastic import evaluate as evaluation

    return evaluation.main(argv)


def export(argv: list[str] | None = None) -> int:
    """paraphrastic-export."""
    export_args(argv)
    from paraphrastic import interop

    return interop.main(argv)


def demo(argv: list[str] | None = None) -> int:
    """paraphrastic-demo."""
    demo_args(argv)
    from paraphrastic import demo as page

    return page.main(argv)


def train(argv: list[str] | None = None) -> int:
    """paraphrastic-train."""
    from paraphrastic.train_config import parse_args

    parse_args(argv)
    from paraphrastic import train as trainer

    return trainer.main(argv)
