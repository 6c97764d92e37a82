"""The demo page (demo.py): its functions without a browser, then the page itself driven in headless chromium."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import generated_sentences, need

from paraphrastic import demo, mine_bitext, models, static
from paraphrastic.fileio import InputError

# One worker runs the module, so that the server and the browser start once
pytestmark = pytest.mark.xdist_group("demo")

SENTENCES = [
    "A man is playing a guitar on the street.",
    "The stock market fell sharply on Monday.",
    "A dog is running through the snow.",
    "It will rain in the north tomorrow.",
    "Two children are building a sandcastle on the beach.",
    "The chef is chopping onions in the kitchen.",
    "A woman is reading a book on the train.",
    "The football team won the championship last night.",
]


@pytest.fixture(scope="module")
def default_model() -> models.Model:
    return demo.get_model("default")


# ----------------------------------------------------------------------------- functions


def test_similarity_is_score_raw_text_with_pieces_and_unknown_note(tiny_model):
    score, pieces_a, pieces_b, note = demo.similarity(tiny_model, "a man is riding a red bicycle", "a cyclist 漢字")
    assert score == tiny_model.score_raw_text([("a man is riding a red bicycle", "a cyclist 漢字")])[0]
    assert "".join(p for p, _ in pieces_a).replace("\u2581", " ").strip() == "a man is riding a red bicycle"
    assert ("[UNK]", "unknown") in pieces_b and note == ""
    _, _, pieces_b, note = demo.similarity(tiny_model, "a man", "漢字 テスト")
    assert "sentence 2 is mostly pieces this model does not know" in note and "multilingual" in note
    assert [label for _, label in pieces_b].count("unknown") >= 2
    _, _, _, note = demo.similarity(tiny_model, "テスト", "漢字")
    assert note.startswith("Note: sentence 1 and sentence 2 are mostly pieces") and "their vectors are" in note


@pytest.mark.parametrize("text", [None, "", "  \n ", demo.MAX_CHARS + 1, 10_000_000], ids=str)
def test_check_text_refuses_empty_and_oversized_boxes(text):
    with pytest.raises(InputError, match="is empty|at most 100,000"):
        demo.check_text("y" * text if isinstance(text, int) else text, "sentence 1")
    assert demo.check_text("x" * demo.MAX_CHARS, "box") == "x" * demo.MAX_CHARS


def test_search_returns_the_exact_top_k(tiny_model):
    lines = generated_sentences(300, seed=3)
    corpus = demo.embed_corpus(tiny_model, "generated", {2 * n + 1: line for n, line in enumerate(lines)})
    assert corpus.vectors.shape == (300, tiny_model.dim) and str(corpus.vectors.dtype) == "torch.float16"
    query = "the old chef is cooking some fresh bread"
    hits, ms = demo.search(tiny_model, corpus, query, k=5)
    exact = np.sort(tiny_model.score_raw_text([(query, line) for line in lines]))[::-1][:5]
    np.testing.assert_allclose([s for s, _, _ in hits], exact, atol=1e-6)
    assert [s for s, _, _ in hits] == tiny_model.score_raw_text([(query, line) for _, _, line in hits]) and ms > 0
    assert all(lines[(number - 1) // 2] == line for _, number, line in hits)  # each hit's line number in the file
    assert len(demo.search(tiny_model, corpus, lines[7], k=500)[0]) == demo.MAX_RESULTS  # a request is bounded
    assert demo.search(tiny_model, corpus, lines[7], k=1)[0][0] == pytest.approx((1.0, 15, lines[7]))
    with pytest.raises(InputError, match="the query is empty"):
        demo.search(tiny_model, corpus, " ")


def test_read_corpus_refuses_binary_non_utf8_empty_and_too_large(tmp_path, monkeypatch):
    good = tmp_path / "good.txt"
    good.write_text("one\n\n  \ntwo\r\nthree")
    assert demo.read_corpus(good, 10, 4) == {1: "one", 4: "two", 5: "three"}
    cases = {
        "binary.txt": (b"\x7fELF\x00\x01\x02", "binary file"),
        "latin1.txt": ("ok\ncaf\u00e9\n".encode("latin-1"), r"latin1.txt:2: invalid UTF-8 at byte 3: save it as UTF-8"),
        "blank.txt": (b"\n \n", "no sentences"),
        "long.txt": (b"a\n" * 11, "11 lines is too large"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InputError, match=message):
            demo.read_corpus(tmp_path / name, 10, 4)
    monkeypatch.setattr(demo, "available_memory", lambda: 1000)
    with pytest.raises(InputError, match="5 lines is too large.*a quarter"):
        demo.read_corpus(good, 10, 256)


def test_match_lists_is_mine_bitext_forward_retrieval(tiny_model_file, tmp_path):
    model = models.load_model(tiny_model_file)
    first = list(dict.fromkeys(generated_sentences(40, seed=5)))[:12]
    second = random.Random(1).sample([s.upper() for s in first], len(first))
    rows = demo.match_lists(model, "\n".join(first[:6] + [""] + first[6:]), "\n".join(second))
    assert [(a.upper(), b) for _, a, b, _, _ in rows] == [(s.upper(), s.upper()) for s in first]
    assert [line for line, *_ in rows] == [*range(1, 7), *range(8, 14)]
    # the margins are those paraphrastic-mine writes for the same lists (with float32 vectors, as the page keeps)
    (tmp_path / "a.txt").write_text("\n".join(first) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(second) + "\n")
    out = tmp_path / "mined.tsv"
    assert mine_bitext.main(["--source", str(tmp_path / "a.txt"), "--target", str(tmp_path / "b.txt"), "--quiet",
                             "--load-file", str(tiny_model_file), "--output-file", str(out), "--retrieval",
                             "forward", "--threshold=-inf", "--dtype", "float32"]) == 0  # fmt: skip
    mined = {a: (b, float(s)) for s, a, b in (line.split("\t") for line in out.read_text().splitlines())}
    for _, a, b, cos, score in rows:
        assert mined[a][0] == b and score == pytest.approx(mined[a][1], abs=1e-6)
        assert cos == pytest.approx(model.similarity([a], [b])[0, 0], abs=1e-5)
    with pytest.raises(InputError, match="the second list is empty"):
        demo.match_lists(model, "a", "\n\n")


def test_unknown_model_name_is_refused_by_function_and_command(capsys):
    with pytest.raises(InputError, match="unknown model 'nope'"):
        demo.get_model("nope")
    assert demo.main(["--model", "nope"]) == 2
    assert "error: unknown model 'nope'" in capsys.readouterr().err


def test_model_choices_offer_multilingual_only_when_installed(tmp_path, monkeypatch):
    present = tmp_path / "default.pt"
    present.touch()
    monkeypatch.setattr(demo, "SHIPPED", {"default": present, "multilingual": tmp_path / "missing.pt"})
    assert demo.model_choices() == ["default"]
    assert demo.model_choices("my.pt") == ["my.pt", "default"]
    (tmp_path / "missing.pt").touch()
    assert demo.model_choices() == ["default", "multilingual"]


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "(default: 127.0.0.1)" in out and "(default: 7860)" in out and "(default: default)" in out


# ----------------------------------------------------------------------------- the page, in a real browser


def tool_or_skip(name: str) -> str:
    """The path of a browser program; a skip where absent, a failure under CI=true."""
    found = shutil.which(name)
    if found:
        return found
    reason = f"{name} is not installed (apt-get install -y chromium chromium-driver)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status


class Server:
    """The demo, started as `python -m paraphrastic.demo` on a free loopback port with a small corpus."""

    def __init__(self, tmp: Path):
        (tmp / "corpus.txt").write_text("\n".join(SENTENCES) + "\n")
        self.tmp, port = tmp, free_port()
        self.url = f"http://127.0.0.1:{port}/"
        self.log = open(tmp / "server.log", "w+")  # noqa: SIM115 (closed by stop)
        command = [sys.executable, "-m", "paraphrastic.demo", "--port", str(port), "--corpus", str(tmp / "corpus.txt"),
                   "--max-corpus-lines", "20", "--threads", "1"]  # fmt: skip
        env = os.environ | {"GRADIO_TEMP_DIR": str(tmp)}
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 90) -> None:
        """Until the page answers (a failure with the server's log when it exits or never answers)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if status(self.url) == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the demo did not start: {(self.tmp / 'server.log').read_text()[-2000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    need("gradio"), need("selenium.webdriver"), tool_or_skip("chromium"), tool_or_skip("chromedriver")
    started = Server(tmp_path_factory.mktemp("demo"))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def browser(server):
    """Headless chromium on the page (started while the server starts), recording every request it makes."""
    webdriver = need("selenium.webdriver")
    binary, driver = tool_or_skip("chromium"), tool_or_skip("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    service = need("selenium.webdriver.chrome.service").Service(driver)
    page = webdriver.Chrome(service=service, options=options)
    try:
        server.wait_ready()
        page.get(server.url)
        yield page
    finally:
        page.quit()


class Page:
    """The few actions the tests take on the demo page."""

    def __init__(self, driver, url: str):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.url, self.by, self.wait = driver, url, By, WebDriverWait(driver, 20)

    def find(self, css: str):
        return self.wait.until(lambda d: d.find_element(self.by.CSS_SELECTOR, css))

    def tab(self, name: str) -> None:
        self.wait.until(
            lambda d: d.find_element(self.by.XPATH, f"//button[@role='tab' and contains(., '{name}')]")
        ).click()

    def type(self, box: str, text: str) -> None:
        """Replace a one-line box's content by typing, key by key."""
        from selenium.webdriver.common.keys import Keys

        area = self.find(f"#{box} textarea")
        area.send_keys(Keys.CONTROL, "a")
        area.send_keys(text if text else Keys.DELETE)

    def paste(self, box: str, text: str) -> None:
        """Set a text box's content at once, as a paste does."""
        self.driver.execute_script(
            "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input', {bubbles: true}));",
            self.find(f"#{box} textarea"), text,
        )  # fmt: skip

    def paste_long(self, box: str, chars: int) -> None:
        """Fill a box with `chars` characters made in the page (not sent over the driver's connection)."""
        self.driver.execute_script(
            "arguments[0].value = 'x'.repeat(arguments[1]); arguments[0].dispatchEvent(new Event('input', {bubbles: true}));",
            self.find(f"#{box} textarea"), chars,
        )  # fmt: skip

    def upload(self, path: Path) -> None:
        clear = self.driver.find_elements(self.by.CSS_SELECTOR, "#corpus-file button[aria-label=Clear]")
        if clear:
            clear[0].click()
        self.find("#corpus-file input[type=file]").send_keys(str(path))

    def text_when(self, css: str, test) -> str:
        """The element's text once `test` holds for it (the last text seen in the failure otherwise)."""
        seen = []
        try:
            return self.wait.until(lambda d: (seen.append(self.find(css).text) or test(seen[-1])) and seen[-1])
        except Exception:
            pytest.fail(f"{css} never satisfied the test; last text: {seen[-1:]!r}")

    def value(self, css: str) -> str:
        return self.find(css).get_attribute("value")

    def alive(self) -> None:
        assert status(self.url) == 200


@pytest.fixture(scope="module")
def page(browser, server) -> Page:
    return Page(browser, server.url)


def test_page_similarity_shows_score_raw_text_and_pieces(page, default_model):
    a, b = "The cat sits on the mat.", "A cat is sitting on a rug."
    page.tab("Similarity")
    example = (page.value("#sentence-1 textarea"), page.value("#sentence-2 textarea"))
    first = f"{default_model.score_raw_text([example])[0]:.4f}"
    page.wait.until(lambda d: page.value("#score textarea") == first)  # the example is scored on load
    page.type("sentence-1", a)
    page.type("sentence-2", b)
    page.find("#score-button").click()
    expected = f"{default_model.score_raw_text([(a, b)])[0]:.4f}"
    page.wait.until(lambda d: page.value("#score textarea") == expected)
    assert "\u2581cat" in page.text_when("#pieces-1", lambda t: "\u2581mat" in t)
    page.type("sentence-2", "漢字テスト")
    page.find("#score-button").click()
    assert "[UNK]" in page.text_when("#pieces-2", lambda t: "[UNK]" in t)
    family = page.driver.execute_script("return getComputedStyle(arguments[0]).fontFamily", page.find("#pieces-2"))
    assert "Noto Sans CJK SC" in family  # the browser's CJK fonts are asked for (none: boxes, docs/usage.md)
    assert "multilingual" in page.text_when("#similarity-message", lambda t: "does not know" in t)


def test_page_search_finds_the_paraphrase(page):
    page.tab("Search")
    page.type("query", "A puppy runs in the snow.")
    page.find("#search-button").click()
    message = page.text_when("#search-message", lambda t: "Top 5 of 8 sentences" in t)
    assert " ms." in message
    rows = page.find("#hits").text.splitlines()
    assert rows[rows.index("sentence") + 2 :][:2] == [str(SENTENCES.index("A dog is running through the snow.") + 1),
                                                      "A dog is running through the snow."]  # fmt: skip


def test_page_search_gives_line_numbers_and_wraps_long_lines(page, server):
    long = "A dog is running through the deep snow" + " and on across the wide white fields" * 20 + "."
    path = server.tmp / "numbered.txt"
    path.write_text(f"\n\nThe market fell.\n\n{long}\nA cat sleeps.\n")
    page.tab("Search")
    page.upload(path)
    page.text_when("#search-message", lambda t: "numbered.txt: 3 sentences" in t)
    page.paste("query", long)
    page.find("#search-button").click()
    page.text_when("#search-message", lambda t: "Top 3 of 3 sentences in numbered.txt" in t)
    rows = page.find("#hits").text.splitlines()
    assert rows[rows.index("sentence") + 2 :][:2] == ["5", long]  # the best hit: its line in the file, then it
    overflow = page.driver.execute_script(
        "return Math.max(...[...document.querySelectorAll('#hits, #hits *')].map(e => e.scrollWidth - e.clientWidth))"
    )
    print(
        page.driver.execute_script(
            "return [...document.querySelectorAll('#hits, #hits *')].filter(e => e.scrollWidth - e.clientWidth > 1).map(e => [e.tagName, e.className, e.scrollWidth, e.clientWidth, getComputedStyle(e).whiteSpace, getComputedStyle(e).overflowX])"
        )
    )
    assert overflow <= 1, "a long line runs off sideways"


def test_page_matching_pairs_each_line_with_its_translation(page):
    first = SENTENCES[:5]
    second = random.Random(2).sample([s.upper() for s in first], 5)
    page.tab("Translation matching")
    page.paste("first-list", "\n".join(first))
    page.paste("second-list", "\n".join(second))
    page.find("#match-button").click()
    page.text_when("#matching-message", lambda t: t.startswith("5 lines"))
    table = page.find("#matches").text
    for line in first:
        assert f"{line}\n{line.upper()}\n" in table


def test_page_bad_inputs_get_messages_and_the_server_stays_up(page, server):
    tmp = server.tmp
    page.tab("Similarity")
    page.type("sentence-1", "")
    page.find("#score-button").click()
    page.text_when("#similarity-message", lambda t: "sentence 1 is empty" in t)
    page.alive()
    page.paste_long("sentence-1", 10_000_000)  # a 10 MB paste
    page.find("#score-button").click()
    page.text_when("#similarity-message", lambda t: "10,000,000 characters; this page takes at most 100,000" in t)
    page.alive()
    page.tab("Translation matching")
    page.paste("second-list", "\n \n")
    page.find("#match-button").click()
    page.text_when("#matching-message", lambda t: "the second list is empty" in t)
    page.alive()
    page.tab("Search")
    files = {
        "binary.bin": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
        "latin1.txt": ("caf\u00e9 au lait\n".encode("latin-1"), "latin1.txt:1: invalid UTF-8"),
        "big.txt": (b"a sentence\n" * 25, "25 lines is too large"),
        "small.txt": (b"a puppy plays in the snow\nthe market fell\n", "small.txt: 2 sentences"),
    }
    for name, (data, message) in files.items():
        (tmp / name).write_bytes(data)
        page.upload(tmp / name)
        page.text_when("#search-message", lambda t, m=message: m in t)
        page.alive()


def test_page_fetches_nothing_from_the_internet(page, browser):
    requests = [
        json.loads(entry["message"])["message"]["params"]["request"]["url"]
        for entry in browser.get_log("performance")
        if '"Network.requestWillBeSent"' in entry["message"]
    ]
    assert requests and all(url.startswith((page.url, "data:", "blob:")) for url in requests), sorted(set(requests))


def test_many_requests_at_once_are_queued_and_answered(page, server, default_model):
    client = need("gradio_client").Client(server.url, verbose=False)
    pairs = [(f"A man is playing guitar number {i}.", "Someone plays a guitar.") for i in range(24)]
    jobs = [client.submit("default", a, b, api_name="/similarity") for a, b in pairs]
    scores = [job.result(timeout=60)[0] for job in jobs]
    assert scores == [f"{s:.4f}" for s in default_model.score_raw_text(pairs)]
    page.alive()


def test_a_port_in_use_is_refused_with_our_option_name():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(InputError, match="pass another --port"):
            demo.check_port("127.0.0.1", taken.getsockname()[1])


def test_the_matching_view_opens_with_an_example_and_hints_at_the_multilingual_model():
    first, second = demo.MATCH_EXAMPLE
    assert len(first) == len(second) >= 2
    rows = demo.match_lists(demo.get_model("multilingual"), "\n".join(first), "\n".join(second))
    assert [b for _, _, b, _, _ in rows] == [second[1], second[2], second[0]]
    assert all(cos > 0.8 and 1 < margin < 10 for *_, cos, margin in rows)
    assert "multilingual" in static.ENGLISH_ONLY and static.english_only("default")
    # the English model reads no German: its cosines are near 0, and a ratio over a mean near 0 (15, 2167 and 3 on
    # 0da63a7) is no margin: left undefined, so none passes cos / MIN_NEIGHBOURHOOD
    rows = demo.match_lists(demo.get_model("default"), "\n".join(first), "\n".join(second))
    assert len(rows) == len(first) and all(margin <= 1 / mine_bitext.MIN_NEIGHBOURHOOD for *_, margin in rows)


def test_the_demo_checks_its_extra_before_any_work(monkeypatch, capsys):
    real = demo.importlib.util.find_spec
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name: None if name == "gradio" else real(name))
    monkeypatch.setattr(demo, "get_model", lambda name: pytest.fail("a model was loaded before the check"))
    assert demo.main([]) == 2
    assert 'pip install "paraphrastic[demo]"' in capsys.readouterr().err


def test_match_lists_refuses_bad_options_and_long_lists(tiny_model_file):
    model = models.load_model(tiny_model_file)
    for retrieval, k in (("bogus", 4), ("forward", 0), ("forward", 10**6)):
        with pytest.raises(InputError, match="retrieval must be one of forward, max-score, intersect"):
            demo.match_lists(model, "a cat", "a dog", retrieval, k)
    many = "\n".join(f"line {i}" for i in range(demo.MAX_LIST_LINES + 1))
    with pytest.raises(InputError, match="matches at most 2,000"):
        demo.match_lists(model, many, "a dog")


def test_search_reads_only_the_named_corpus_or_an_upload(tmp_path):
    gradio_utils = pytest.importorskip("gradio.utils")
    corpus = tmp_path / "corpus.txt"
    assert demo.corpus_file(None, corpus) == corpus and demo.corpus_file(str(corpus), corpus) == corpus.resolve()
    uploaded = Path(gradio_utils.get_upload_folder()) / "abc" / "mine.txt"
    assert demo.corpus_file(str(uploaded), corpus) == uploaded.resolve()
    for path in ("/etc/passwd", str(Path(gradio_utils.get_upload_folder()) / ".." / "secret.txt")):
        with pytest.raises(InputError, match="not a file uploaded to this page"):
            demo.corpus_file(path, corpus)


def test_the_pages_uploads_are_removed_when_it_stops(tiny_model_file, tmp_path, monkeypatch):
    """Uploads went to /tmp/gradio and stayed there after the demo exited (369 MB after one session)."""
    need("gradio")
    monkeypatch.setenv("GRADIO_TEMP_DIR", "")  # restored as it was when the test ends, whatever main sets
    monkeypatch.delenv("GRADIO_TEMP_DIR")
    seen = []

    class Page:
        def launch(self, **options):  # an upload arrives, then Ctrl-C
            folder = Path(os.environ["GRADIO_TEMP_DIR"])
            (folder / "abc").mkdir()
            (folder / "abc" / "corpus.txt").write_text("a man plays\n")
            seen.append(folder)
            raise KeyboardInterrupt

    monkeypatch.setattr(demo, "build_app", lambda *args: (Page(), {}))
    monkeypatch.setattr(demo, "check_port", lambda host, port: None)
    assert demo.main(["--model", str(tiny_model_file), "--corpus", str(demo.EXAMPLE_CORPUS)]) == 130
    assert seen and not seen[0].exists()
