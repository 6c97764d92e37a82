"""Fetch the evaluation data from its official sources into the layout evaluate.py reads.

Layout (the same as ../shared/data): `sts/en/<year>/<name>.tsv` and `sts/en/stsb/<split>.tsv`
(`score<TAB>sentence1<TAB>sentence2`, only pairs with a gold score), `sts/2017/<pair>.tsv` (column
order follows the name), `tatoeba/<lang>-eng.<lang>` + `tatoeba/<lang>-eng.eng` (line-aligned).
With --local DIR the archives are read from DIR under their official file names instead.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from paraphrastic.cli import run_cli
from paraphrastic.fileio import InputError, atomic_output
from paraphrastic.options import default_data_dir
from paraphrastic.preprocess.download import fetch

STS_WIKI = "http://ixa2.si.ehu.es/stswiki/images"
STS_YEARS = {
    "2012": f"{STS_WIKI}/4/40/STS2012-en-test.zip",
    "2013": f"{STS_WIKI}/2/2f/STS2013-en-test.zip",
    "2014": f"{STS_WIKI}/8/8c/STS2014-en-test.zip",
    "2015": f"{STS_WIKI}/d/da/STS2015-en-test.zip",
    "2016": f"{STS_WIKI}/9/98/STS2016-en-test.zip",
}
STSB_URL = f"{STS_WIKI}/4/48/Stsbenchmark.tar.gz"
STS17_URLS = [
    "http://alt.qcri.org/semeval2017/task1/data/uploads/sts2017.eval.v1.1.zip",
    "http://alt.qcri.org/semeval2017/task1/data/uploads/sts2017.gs.zip",
]
# track -> (our file name, whether the raw file has English first and must be swapped to match the name)
STS17_TRACKS = {
    "track1.ar-ar": ("ar-ar", False),
    "track2.ar-en": ("ar-en", True),
    "track3.es-es": ("es-es", False),
    "track4a.es-en": ("es-en", False),
    "track4b.es-en": ("es-en-wmt", True),
    "track5.en-en": ("en-en", False),
    "track6.tr-en": ("tr-en", True),
}
TATOEBA_URL = "https://raw.githubusercontent.com/facebookresearch/LASER/main/data/tatoeba/v1/tatoeba.{lang}-eng.{side}"
TATOEBA_LANGS = (
    "afr amh ang ara arq arz ast awa aze bel ben ber bos bre bul cat cbk ceb ces cha cmn cor csb cym dan deu dsb "
    "dtp ell epo est eus fao fin fra fry gla gle glg gsw heb hin hrv hsb hun hye ido ile ina ind isl ita jav jpn "
    "kab kat kaz khm kor kur kzj lat lfn lit lvs mal mar max mhr mkd mon nds nld nno nob nov oci orv pam pes pms "
    "pol por ron rus slk slv spa sqi srp swe swg swh tam tat tel tgl tha tuk tur tzl uig ukr urd uzb vie war wuu "
    "xho yid yue zsm"
).split()
STS_INPUT = re.compile(r"(?:^|/)STS(?:2016)?\.input\.(?P<name>.+)\.txt$")


def decode(raw: bytes) -> list[str]:
    """Lines of an official file: UTF-8, or Latin-1 for the few older files that are not."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return text.splitlines()


def clean(sentence: str) -> str:
    return " ".join(sentence.split())


def scored_rows(inputs: list[str], gold: list[str], swap: bool = False) -> list[str]:
    """`score<TAB>s1<TAB>s2` rows for the pairs that have a gold score (the first two input columns)."""
    rows = []
    for line, score in zip(inputs, gold, strict=False):
        if not score.strip():
            continue
        a, b = (clean(c) for c in line.split("\t")[:2])
        rows.append(f"{float(score)}\t{b}\t{a}" if swap else f"{float(score)}\t{a}\t{b}")
    return rows


def write_rows(path: Path, rows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path, "w") as f:
        f.write("".join(r + "\n" for r in rows))


def convert_sts_year(archive: Path, out: Path) -> list[str]:
    """One STS 2012-2016 test zip -> one tsv per dataset (`surprise.` prefixes dropped); inputs with no gold skipped."""
    written = []
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        for member in sorted(names):
            m = STS_INPUT.search(member)
            gold = member.replace(".input.", ".gs.")
            if not m or gold not in names:
                continue
            name = m["name"].removeprefix("surprise.")
            write_rows(out / f"{name}.tsv", scored_rows(decode(z.read(member)), decode(z.read(gold))))
            written.append(name)
    return written


def convert_stsb(archive: Path, out: Path) -> list[str]:
    """STS Benchmark tar.gz -> train/dev/test tsv (columns 5, 6, 7 of the csv: score, s1, s2)."""
    written = []
    with tarfile.open(archive) as t:
        for member in t.getmembers():
            m = re.search(r"sts-(train|dev|test)\.csv$", member.name)
            if not m:
                continue
            lines = decode(t.extractfile(member).read())
            rows = [f"{float(c[4])}\t{clean(c[5])}\t{clean(c[6])}" for c in (line.split("\t") for line in lines)]
            write_rows(out / f"{m[1]}.tsv", rows)
            written.append(m[1])
    return written


def convert_sts17(eval_zip: Path, gold_zip: Path, out: Path) -> list[str]:
    """STS 2017 input + gold zips -> one tsv per track, in the order of the file name.

    When a gold file is shorter than its input (tr-en: 250 scores for 500 lines) the scores belong
    to the first lines, so only those are kept.
    """
    with zipfile.ZipFile(eval_zip) as ze, zipfile.ZipFile(gold_zip) as zg:
        inputs = {Path(n).name: n for n in ze.namelist()}
        golds = {Path(n).name: n for n in zg.namelist()}
        written = []
        for track, (name, swap) in STS17_TRACKS.items():
            source, gold = inputs.get(f"STS.input.{track}.txt"), golds.get(f"STS.gs.{track}.txt")
            if source is None or gold is None:
                raise InputError(f"{eval_zip}/{gold_zip}: STS 2017 {track} is missing")
            write_rows(out / f"{name}.tsv", scored_rows(decode(ze.read(source)), decode(zg.read(gold)), swap))
            written.append(name)
    return written


def tatoeba(out: Path, local: Path | None, downloads: Path) -> list[str]:
    """LASER Tatoeba v1: 112 languages x English, from GitHub or a local folder of tatoeba.* files."""
    for lang in TATOEBA_LANGS:
        for side in (lang, "eng"):
            name = f"tatoeba.{lang}-eng.{side}"
            src = (
                _local_file(local, name) if local else fetch(TATOEBA_URL.format(lang=lang, side=side), downloads / name)
            )
            (out / "tatoeba").mkdir(parents=True, exist_ok=True)
            with atomic_output(out / "tatoeba" / name.removeprefix("tatoeba."), "wb") as f:
                f.write(src.read_bytes())
    return TATOEBA_LANGS


def _local_file(local: Path, name: str) -> Path:
    hits = [p for p in (local / name, local / "tatoeba" / name) if p.is_file()] or sorted(local.rglob(name))
    if not hits:
        raise InputError(f"{local}: {name} not found (put the official archives there under their own names)")
    return hits[0]


def source(url: str, local: Path | None, downloads: Path) -> Path:
    """The archive of `url`: the file of the same name in `local`, else a verified download."""
    name = url.rsplit("/", 1)[-1]
    return _local_file(local, name) if local else fetch(url, downloads / name)


@contextlib.contextmanager
def reading(archive: Path) -> Iterator[None]:
    """A garbage archive (bad zip or tar, truncated, scores that are no numbers) read in the block becomes an
    InputError naming it; nothing half-converted is kept, since every output is written atomically."""
    try:
        yield
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, ValueError, KeyError) as e:
        reason = (str(e) or type(e).__name__).splitlines()[0]
        raise InputError(f"{archive}: not a usable archive ({reason}); delete it and download it again") from None


def convert(converter, *archives: Path, out: Path) -> list[str]:
    """`converter(*archives, out)`, with a damaged archive reported as one error naming it."""
    with reading(archives[-1] if len(archives) == 1 else Path(" and ".join(map(str, archives)))):
        return converter(*archives, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m paraphrastic.preprocess.evaluation.download", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--out", type=Path, default=default_data_dir(), help="data folder to fill (default: where evaluate looks)"
    )
    p.add_argument("--local", type=Path, help="folder holding the official archives (no download)")
    p.add_argument("--downloads", type=Path, default=Path(__file__).resolve().parent / "downloads",
                   help="folder the archives are downloaded into and kept (a second run reuses them)")  # fmt: skip
    p.add_argument("--only", nargs="*", choices=[*STS_YEARS, "stsb", "2017", "tatoeba"], help="a subset")
    args = p.parse_args(argv)
    if args.local and not args.local.is_dir():
        raise InputError(f"{args.local}: EVAL_LOCAL_DIR is not a folder")
    wanted = set(args.only or [*STS_YEARS, "stsb", "2017", "tatoeba"])
    for year, url in STS_YEARS.items():
        if year in wanted:
            names = convert(
                convert_sts_year, source(url, args.local, args.downloads), out=args.out / "sts" / "en" / year
            )
            print(f"STS {year}: {', '.join(names)}", file=sys.stderr)
    if "stsb" in wanted:
        names = convert(
            convert_stsb, source(STSB_URL, args.local, args.downloads), out=args.out / "sts" / "en" / "stsb"
        )
        print(f"STS Benchmark: {', '.join(names)}", file=sys.stderr)
    if "2017" in wanted:
        archives = [source(url, args.local, args.downloads) for url in STS17_URLS]
        print(
            f"STS 2017: {', '.join(convert(convert_sts17, *archives, out=args.out / 'sts' / '2017'))}", file=sys.stderr
        )
    if "tatoeba" in wanted:
        print(f"Tatoeba: {len(tatoeba(args.out, args.local, args.downloads))} languages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main)())
