"""The work of paraphrastic-demo (its options: options.demo_args): a local demo web page: how similar two
sentences are, search in a corpus, and translation matching.

    paraphrastic-demo --corpus sentences.txt       # then open http://127.0.0.1:7860

The page is served on this machine only (127.0.0.1 unless --host says otherwise), fetches nothing from
the internet and sends no analytics. Each view calls what the scripts call: score_raw_text, embed_raw_text
and mine_bitext's margin-scored matching. Needs the `demo` extra: pip install "paraphrastic[demo]"
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from paraphrastic import knn, mine_bitext
from paraphrastic.cli import run_cli
from paraphrastic.fileio import Error, InputError, count_lines, install_hint, open_input, read_lines
from paraphrastic.options import EXAMPLE_CORPUS, MAX_CORPUS_LINES
from paraphrastic.options import demo_args as parse_args
from paraphrastic.static import ENGLISH_ONLY, SHIPPED, english_only
from paraphrastic.workers import available_memory, use_threads

if TYPE_CHECKING:  # torch is imported where the page first needs it: --help answers without it (0.1 s, not 1 s)
    import torch

    from paraphrastic.models import Model

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported: no usage reports, no version check
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

MAX_CHARS = 100_000  # per text box
MAX_LIST_LINES = 2_000  # per list of the matching view: two such lists match in well under a second
RETRIEVALS = ("forward", "max-score", "intersect")
MAX_RESULTS = 50  # search results a request may ask for
MAX_UPLOAD = "200mb"
SHORTLIST = 32  # corpus lines kept by the float16 scan, then scored exactly with score_raw_text
# the browser's own fonts, CJK ones after the Latin (a machine with none shows CJK text as boxes: docs/usage.md)
CJK_FONTS = ["Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Microsoft YaHei", "WenQuanYi Micro Hei"]
FONTS = (["Helvetica", "Arial", "DejaVu Sans", *CJK_FONTS, "sans-serif"],
         ["DejaVu Sans Mono", "Courier New", *CJK_FONTS, "monospace"])  # fmt: skip
CSS = "#hits td, #hits td * {white-space: normal !important; overflow-wrap: anywhere}"  # Gradio 6 ignores wrap=True

# the matching view's opening example: three sentences of our own and their German, not data
MATCH_EXAMPLE = (
    ["A man is playing a guitar.", "The children are swimming in the lake.", "Where is the train station?"],
    ["Wo ist der Bahnhof?", "Ein Mann spielt Gitarre.", "Die Kinder schwimmen im See."],
)
ALLOWED = set(SHIPPED)  # model names the page may load; main adds the --model file
_models: dict[str, Model] = {}
_corpora: OrderedDict[tuple, Corpus] = OrderedDict()
_model_lock, _corpus_lock = threading.Lock(), threading.Lock()


@dataclass
class Corpus:
    """Searchable sentences: the non-blank lines of a file, their line numbers (from 1) and their unit vectors
    (float16, one row each)."""

    name: str
    numbers: list[int]
    lines: list[str]
    vectors: torch.Tensor


# ----------------------------------------------------------------------------- models and input checks


def model_choices(given: str = "default") -> list[str]:
    """The models the page offers: the shipped ones that are installed, and the one given with --model."""
    names = [name for name, path in SHIPPED.items() if path.exists()]
    return names if given in names else [given, *names]


def get_model(name: str) -> Model:
    """A shipped model by name (or the --model file), loaded once and cached."""
    if name not in ALLOWED:
        raise InputError(f"unknown model {name!r}: choose {' or '.join(SHIPPED)}, or start with --model FILE")
    from paraphrastic.models import load_model

    with _model_lock:
        if name not in _models:
            _models[name] = load_model(name)
        return _models[name]


def check_text(text: str | None, what: str) -> str:
    """The text of one box, or a message saying it is empty or over the size cap."""
    if not text or not text.strip():
        raise InputError(f"{what} is empty: type some text")
    if len(text) > MAX_CHARS:
        raise InputError(f"{what} has {len(text):,} characters; this page takes at most {MAX_CHARS:,} per box")
    return text


def unknown_note(model: Model, texts: list[str], what: list[str]) -> str:
    """A note naming the texts that are mostly pieces the model does not know (their scores mean little)."""
    names = [name for name, bad in zip(what, model.mostly_unknown(texts), strict=True) if bad]
    if not names:
        return ""
    hint = "" if model.config.get("multilingual") else "; for other languages and scripts try the multilingual model"
    are, its = ("are", "their vectors are") if len(names) > 1 else ("is", "its vector is")
    return (f"Note: {' and '.join(names)} {are} mostly pieces this model does not know ([UNK]), so {its} close to "
            f"the unknown piece's and the score means little{hint}.")  # fmt: skip


# ----------------------------------------------------------------------------- similarity


def pieces(model: Model, text: str) -> list[tuple[str, str | None]]:
    """The sentencepiece pieces a text becomes, unknown ones as ("[UNK]", "unknown")."""
    tokenizer = model.sp_tokenizer
    if tokenizer is None:
        return [("(pieces are shown for sentencepiece models only)", None)]
    ids = tokenizer.encode([text])[0]
    return [("[UNK]", "unknown") if i == tokenizer.unk_id else (tokenizer.sp.id_to_piece(i), None) for i in ids]


def spaced(parts: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """Pieces with a space between them, for HighlightedText."""
    return [item for part in parts for item in (part, (" ", None))][:-1]


def similarity(model: Model, a: str | None, b: str | None) -> tuple[float, list, list, str]:
    """score_raw_text's cosine of two sentences, the pieces of each, and a note when the score means little."""
    a, b = check_text(a, "sentence 1"), check_text(b, "sentence 2")
    score = model.score_raw_text([(a, b)])[0]
    return score, pieces(model, a), pieces(model, b), unknown_note(model, [a, b], ["sentence 1", "sentence 2"])


# ----------------------------------------------------------------------------- search


def check_corpus_size(lines: int, dim: int, max_lines: int, name: str) -> None:
    """Refuse a corpus over --max-corpus-lines or whose vectors would take over a quarter of available memory."""
    need, memory = lines * dim * 2, available_memory()  # float16 rows
    if lines > max_lines or need > memory // 4:
        raise InputError(f"{name}: {lines:,} lines is too large for this page (at most {max_lines:,} lines, and "
                         f"{need / 2**30:.1f} GiB of vectors against {memory / 2**30:.1f} GiB free; the cap is a quarter)")  # fmt: skip


def read_corpus(path: str | os.PathLike, max_lines: int, dim: int) -> dict[int, str]:
    """The non-blank lines of a UTF-8 text file by their line numbers (from 1); binary, non-UTF-8, empty or too
    large files get a message."""
    path = Path(path)
    open_input(path)
    with open(path, "rb") as f:
        if b"\0" in f.read(8192):
            raise InputError(f"{path.name}: a binary file, not text: give a UTF-8 text file, one sentence per line")
    check_corpus_size(count_lines(path), dim, max_lines, path.name)
    try:
        lines = {n: line for n, line in enumerate(read_lines(path, strict=True), 1) if line.strip()}
    except InputError as e:
        raise InputError(str(e).replace(str(path), path.name).split(" (re-encode")[0] + ": save it as UTF-8") from None
    if not lines:
        raise InputError(f"{path.name}: no sentences (the file is empty or blank)")
    return lines


def embed_corpus(model: Model, name: str, numbered: dict[int, str], progress: Callable | None = None) -> Corpus:
    """Embed the lines (by line number) once into unit float16 rows, reporting progress(fraction, desc=...) per
    batch."""
    import torch

    lines = list(numbered.values())
    vectors, batch = torch.empty((len(lines), model.dim), dtype=torch.float16), 16384
    with model.start_multi_process_pool() as pool:  # one worker per --threads
        for start in range(0, len(lines), batch):
            if progress:
                progress(start / len(lines), desc=f"embedding {name}: {start:,} of {len(lines):,} sentences")
            part = model.embed_raw_text(lines[start : start + batch], pool=pool)
            vectors[start : start + len(part)] = torch.from_numpy(knn.unit_rows(part))
    if progress:
        progress(1.0, desc=f"embedded {name}: {len(lines):,} sentences")
    return Corpus(name, list(numbered), lines, vectors)


def corpus_file(upload: str | None, corpus: str | os.PathLike) -> Path:
    """The file a search reads: the corpus named when the page was started, or one uploaded through the page (in
    Gradio's upload folder). A client can send any path: no other file is read."""
    if not upload:
        return Path(corpus)
    from gradio.utils import get_upload_folder

    path = Path(upload).resolve()
    if path == Path(corpus).resolve() or path.is_relative_to(Path(get_upload_folder()).resolve()):
        return path
    raise InputError(f"{Path(upload).name}: not a file uploaded to this page; upload the corpus to search it")


def load_corpus(model_name: str, path: str | os.PathLike, max_lines: int, progress: Callable | None = None) -> Corpus:
    """The corpus in a file embedded by a model, cached (the two most recent) so that it is embedded once."""
    model, stat = get_model(model_name), Path(path).stat()
    key = (model_name, str(path), stat.st_mtime_ns, stat.st_size)
    with _corpus_lock:
        if key not in _corpora:
            if progress:
                progress(0.0, desc=f"reading {Path(path).name}")
            _corpora[key] = embed_corpus(model, Path(path).name, read_corpus(path, max_lines, model.dim), progress)
            while len(_corpora) > 2:
                _corpora.popitem(last=False)
        _corpora.move_to_end(key)
        return _corpora[key]


def search(model: Model, corpus: Corpus, query: str | None, k: int = 5) -> tuple[list[tuple[float, int, str]], float]:
    """The k corpus lines nearest the query, best first, as (score_raw_text's score, line number, line), and the
    time in ms: a float16 matrix-vector scan shortlists SHORTLIST lines, which are then scored exactly."""
    import torch

    query, k = check_text(query, "the query"), min(max(1, int(k)), MAX_RESULTS)
    start = time.perf_counter()
    q = torch.from_numpy(knn.unit_rows(model.embed_raw_text([query]))[0])
    scan = (corpus.vectors @ q.to(corpus.vectors.dtype)).float().numpy()
    m = min(max(k, SHORTLIST), len(scan))
    shortlist = np.sort(np.argpartition(-scan, m - 1)[:m])  # in file order: ties go to the earlier line
    exact = np.array(model.score_raw_text([(query, corpus.lines[i]) for i in shortlist]))
    best = np.argsort(-exact, kind="stable")[:k]
    hits = [(float(exact[j]), corpus.numbers[shortlist[j]], corpus.lines[shortlist[j]]) for j in best]
    return hits, (time.perf_counter() - start) * 1000


# ----------------------------------------------------------------------------- translation matching


def match_lists(model: Model, first: str | None, second: str | None, retrieval: str = "forward", k: int = 4) -> list:
    """(line, sentence, match, cosine, margin) for each line of the first list, by mine_bitext's mine (ratio margin
    over k neighbours both ways; forward: each line's best match); "" and -inf where a line found none, a margin of
    -inf where it is undefined (mine_bitext.margin)."""
    a = check_text(first, "the first list").splitlines()
    b = check_text(second, "the second list").splitlines()
    if retrieval not in RETRIEVALS or not isinstance(k, int) or not 1 <= k <= 64:
        raise InputError(f"retrieval must be one of {', '.join(RETRIEVALS)} and k a whole number in 1..64")
    if max(len(a), len(b)) > MAX_LIST_LINES:
        raise InputError(f"a list has {max(len(a), len(b)):,} lines; this page matches at most {MAX_LIST_LINES:,} "
                         "(paraphrastic-mine takes any number)")  # fmt: skip
    args = mine_bitext.parse_args(["--source", "first", "--target", "second", "--output-file", "-", "--quiet",
                                   "--retrieval", retrieval, "--k", str(k), "--index", "flat"])  # fmt: skip
    sides = [
        mine_bitext.Side(Path(name), model.embed_raw_text(lines), np.flatnonzero([bool(s.strip()) for s in lines]))
        for name, lines in (("first list", a), ("second list", b))
    ]
    src, tgt, score = mine_bitext.mine(*sides, args)
    cos = np.einsum("ij,ij->i", knn.unit_rows(sides[0].vectors[src]), knn.unit_rows(sides[1].vectors[tgt]))
    found = dict(zip(src.tolist(), zip(tgt.tolist(), cos.tolist(), score.tolist(), strict=True), strict=True))
    return [
        (i + 1, a[i], b[found[i][0]] if i in found else "", *found.get(i, (0, -np.inf, -np.inf))[1:])
        for i in sides[0].rows.tolist()
    ]


# ----------------------------------------------------------------------------- the page


def build_app(
    model_name: str = "default", corpus: str | os.PathLike = EXAMPLE_CORPUS, max_lines: int = MAX_CORPUS_LINES
):
    """The page: a model choice and three tabs, each a thin layer over the functions above."""
    import gradio as gr  # the `demo` extra, needed only to serve the page

    def failed(e: Exception) -> str:
        return f"**Error:** {e}" if isinstance(e, Error) else "**Error:** out of memory: try a smaller input"

    def on_similarity(name: str, a: str, b: str):
        try:
            score, pieces_a, pieces_b, note = similarity(get_model(name), a, b)
            return f"{score:.4f}", spaced(pieces_a), spaced(pieces_b), note
        except (Error, MemoryError) as e:
            return "", [], [], failed(e)

    def on_upload(name: str, upload: str | None, progress=gr.Progress()):  # noqa: B008 (Gradio's idiom)
        try:
            found = load_corpus(name, corpus_file(upload, corpus), max_lines, progress)
            return [], f"Corpus {found.name}: {len(found.lines):,} sentences, embedded."
        except (Error, MemoryError) as e:
            return [], failed(e)

    def on_search(name: str, upload: str | None, query: str, k: float, progress=gr.Progress()):  # noqa: B008 (Gradio's idiom)
        try:
            found = load_corpus(name, corpus_file(upload, corpus), max_lines, progress)
            hits, ms = search(get_model(name), found, query, int(k))
            note = unknown_note(get_model(name), [query], ["the query"])
            summary = f"Top {len(hits)} of {len(found.lines):,} sentences in {found.name}; the query took {ms:.1f} ms."
            return [[f"{s:.4f}", number, line] for s, number, line in hits], f"{summary} {note}"
        except (Error, MemoryError) as e:
            return [], failed(e)

    def on_match(name: str, first: str, second: str, retrieval: str):
        try:
            rows = match_lists(get_model(name), first, second, retrieval)
            shown = lambda x: f"{x:.4f}" if np.isfinite(x) else ""  # noqa: E731
            table = [[i, a, b or "(no match)", shown(c), shown(m)] for i, a, b, c, m in rows]
            note = f" **Note:** {ENGLISH_ONLY.replace('--load-file multilingual', 'the model multilingual above')}."
            return table, f"{len(rows)} lines; margin: cosine over the mean cosine of both sides' 4 nearest " + (
                "neighbours (none where that mean is under 0.05: nothing near)." + (note if english_only(name) else "")
            )
        except (Error, MemoryError) as e:
            return [], failed(e)

    style = {"theme": gr.themes.Base(font=FONTS[0], font_mono=FONTS[1]), "css": CSS}  # system fonts only
    in_launch = "theme" in inspect.signature(gr.Blocks.launch).parameters  # Gradio 6 moved both to launch()
    with gr.Blocks(title="paraphrastic demo", analytics_enabled=False, **({} if in_launch else style)) as app:
        gr.Markdown("## Paraphrastic sentence embeddings\nScores are cosines of averaged sentencepiece vectors. "
                    f"Each box takes up to {MAX_CHARS:,} characters.")  # fmt: skip
        model = gr.Dropdown(model_choices(model_name), value=model_name, label="Model", elem_id="model")
        with gr.Tab("Similarity", id="similarity"):
            with gr.Row():
                a = gr.Textbox(label="Sentence 1", elem_id="sentence-1", value="A man is playing a guitar.")
                b = gr.Textbox(label="Sentence 2", elem_id="sentence-2", value="Someone is strumming a guitar.")
            score_button = gr.Button("Score", variant="primary", elem_id="score-button")
            score = gr.Textbox(label="Cosine similarity", elem_id="score", interactive=False)
            unknown = {"unknown": "red"}
            with gr.Row():
                pieces_a = gr.HighlightedText(label="Pieces of sentence 1", elem_id="pieces-1", color_map=unknown)
                pieces_b = gr.HighlightedText(label="Pieces of sentence 2", elem_id="pieces-2", color_map=unknown)
            message = gr.Markdown(elem_id="similarity-message")
            score_button.click(
                on_similarity, [model, a, b], [score, pieces_a, pieces_b, message], api_name="similarity"
            )
            app.load(on_similarity, [model, a, b], [score, pieces_a, pieces_b, message])  # the example, scored
        with gr.Tab("Search", id="search"):
            upload = gr.File(label=f"Corpus: UTF-8 text, one sentence per line (default: {Path(corpus).name})",
                             type="filepath", elem_id="corpus-file")  # fmt: skip
            with gr.Row():
                query = gr.Textbox(label="Query", elem_id="query", value="A dog plays in the snow.", scale=4)
                k = gr.Slider(1, MAX_RESULTS, value=5, step=1, label="Results", elem_id="k")
            search_button = gr.Button("Search", variant="primary", elem_id="search-button")
            hits = gr.Dataframe(
                headers=["score", "line", "sentence"],
                elem_id="hits",
                interactive=False,
                wrap=True,
                column_widths=["12%", "10%", "78%"],
            )  # long sentences wrap within the page
            message = gr.Markdown(elem_id="search-message")
            upload.upload(on_upload, [model, upload], [hits, message], api_name="corpus")
            search_button.click(on_search, [model, upload, query, k], [hits, message], api_name="search")
        with gr.Tab("Translation matching", id="matching"):
            with gr.Row():
                first = gr.Textbox(label="First list, one sentence per line", lines=6, elem_id="first-list",
                                   value="\n".join(MATCH_EXAMPLE[0]))  # fmt: skip
                second = gr.Textbox(label="Second list (another language)", lines=6, elem_id="second-list",
                                    value="\n".join(MATCH_EXAMPLE[1]))  # fmt: skip
            retrieval = gr.Radio(list(RETRIEVALS), value="forward", label="Retrieval",
                                 info="forward: each line's best match; max-score: one to one")  # fmt: skip
            match_button = gr.Button("Match", variant="primary", elem_id="match-button")
            matches = gr.Dataframe(
                headers=["line", "sentence", "best match", "cosine", "margin"], elem_id="matches", wrap=True
            )
            message = gr.Markdown(elem_id="matching-message")
            match_button.click(on_match, [model, first, second, retrieval], [matches, message], api_name="match")
    app.queue(max_size=64, default_concurrency_limit=2)  # more requests wait their turn, up to 64
    return app, (style if in_launch else {})


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model not in SHIPPED and not Path(args.model).exists():
        raise InputError(f"unknown model {args.model!r}: give {' or '.join(SHIPPED)}, or a model file")
    if importlib.util.find_spec("gradio") is None:  # before any work: the page needs it
        raise InputError(f"the demo needs its extra: {install_hint('demo')}")
    use_threads(args.threads)
    uploads = None
    if "GRADIO_TEMP_DIR" not in os.environ:  # uploads in a folder of this run, not kept in /tmp/gradio for ever
        uploads = os.environ["GRADIO_TEMP_DIR"] = tempfile.mkdtemp(prefix="paraphrastic-demo-")
    ALLOWED.add(args.model)
    get_model(args.model)  # a bad model file fails here, not in the page
    open_input(args.corpus)
    check_port(args.host, args.port)
    with tqdm(total=1.0, bar_format="{desc}: {percentage:3.0f}%|{bar}|", file=sys.stderr) as bar:
        report = lambda done, desc="": (bar.set_description_str(desc.split(":")[0]), bar.update(done - bar.n))  # noqa: E731
        load_corpus(args.model, args.corpus, args.max_corpus_lines, report)  # the first search finds it embedded
    app, options = build_app(args.model, args.corpus, args.max_corpus_lines)
    known = inspect.signature(app.launch).parameters
    options |= {"max_file_size": MAX_UPLOAD, "enable_monitoring": False, "show_api": False, "mcp_server": False}
    options |= {"run_history": False, "quiet": True}  # Gradio 6 would keep each request in the browser
    options = {key: value for key, value in options.items() if key in known}  # what this Gradio version takes
    print(f"serving the demo on http://{args.host}:{args.port}/ (Ctrl-C stops it)", file=sys.stderr, flush=True)
    try:
        app.launch(server_name=args.host, server_port=args.port, share=False, **options)
    finally:
        if uploads:  # the page's uploads (corpora of up to 200 MB each) go with it
            shutil.rmtree(uploads, ignore_errors=True)
    return 0


def check_port(host: str, port: int) -> None:
    """Refuse a port another program serves on, with our option's name (Gradio's own message names its variable)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as e:
            raise InputError(f"{host}:{port}: cannot serve there ({e.strerror.lower()}); pass another --port") from None


if __name__ == "__main__":
    sys.exit(main())
