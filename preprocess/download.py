"""Verified downloads: ParaNMT-50M, OPUS bitext, the fastText lid.176 model.

A download goes to a temporary name and is renamed into place only when its size matches the
server's Content-Length, its checksum matches (where one is published) and, for archives, every
member passes its CRC check on extraction. A file already in place is never fetched again.
Every source also takes a local file instead (see preprocess/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path

from tqdm import tqdm

from paraphrastic.cli import run_cli
from paraphrastic.fileio import InputError, atomic_output
from paraphrastic.preprocess.steps import load_lid

# ParaNMT-50M as released by its authors (Wieting & Gimpel 2018; the link of the paper's repository).
PARANMT_URL = (
    "https://drive.usercontent.google.com/download?id=1rbF3daJjCsa1-fu2GANeJd2FBXos1ugD&export=download&confirm=t"
)
PARANMT_MEMBER = "para-nmt-50m.txt"
LID_URL = "https://dl.fbaipublicfiles.com/fasttext/supervised-models/lid.176.bin"
OPUS_URL = "https://object.pouta.csc.fi/OPUS-{corpus}/{version}/moses/{pair}.txt.zip"
# The corpora the paper names: (version, languages it was used for; None = every language OPUS has).
OPUS_CORPORA = {
    "OpenSubtitles": ("v2018", None),
    "Tanzil": ("v1", None),
    "Europarl": ("v8", {"es"}),
    "GlobalVoices": ("v2018q4", None),
    "MultiUN": ("v1", None),
}


class NotFound(InputError):
    """The server has no file at the address (HTTP 404)."""


def fetch(url: str, dest: Path, sha256: str | None = None, md5: str | None = None) -> Path:
    """Download `url` to `dest` unless already there; a short, mismatched or HTML answer is an error."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    request = urllib.request.Request(url, headers={"User-Agent": "paraphrastic-preprocess/1"})
    digests = {name: hashlib.new(name) for name, want in (("sha256", sha256), ("md5", md5)) if want}
    try:
        with urllib.request.urlopen(request, timeout=120) as r, atomic_output(dest) as f:
            if r.headers.get_content_type() == "text/html" and not url.endswith((".html", ".htm")):
                raise InputError(f"{url}: the server answered with a web page, not the file (quota or moved?)")
            expected = int(r.headers.get("Content-Length") or -1)
            archive = dest.name.endswith(ARCHIVES)
            if expected < 0 and not digests and not archive:
                raise InputError(
                    f"{url}: the server gives no size and there is no checksum or archive test to verify "
                    f"{dest.name} by; download it yourself and pass it with --local ({LOCAL_HINT})"
                )
            got = 0
            with tqdm(total=expected if expected >= 0 else None, unit="B", unit_scale=True, desc=dest.name) as bar:
                while block := r.read(1 << 20):
                    f.write(block)
                    for d in digests.values():
                        d.update(block)
                    got += len(block)
                    bar.update(len(block))
            if expected >= 0 and got != expected:
                raise InputError(f"{url}: partial download ({got} of {expected} bytes); run again")
            for name, want in (("sha256", sha256), ("md5", md5)):
                if want and digests[name].hexdigest() != want.lower():
                    raise InputError(f"{url}: {name} {digests[name].hexdigest()} does not match {want}")
            f.flush()
            check_archive(Path(f.name), dest, url)
    except urllib.error.HTTPError as e:
        raise (NotFound if e.code == 404 else InputError)(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise InputError(
            f"{url}: cannot download ({e.reason}); download it elsewhere and pass it with --local ({LOCAL_HINT})"
        ) from None
    return dest


LOCAL_HINT = "the file; for the evaluation data, the folder holding the archives under their own names"
ARCHIVES = (".zip", ".tar.gz", ".tgz")  # downloads that can be tested as archives before they are kept


def check_archive(path: Path, dest: Path, url: str) -> None:
    """An archive download must open as one (a download cut short, with no Content-Length to tell, loses
    the directory at its end); other files have only their size and checksums to go by."""
    try:
        if dest.name.endswith(".zip"):
            zipfile.ZipFile(path).close()
        elif dest.name.endswith(ARCHIVES):
            with tarfile.open(path) as t:
                for _ in t:  # reads the whole stream: a truncated one fails here
                    pass
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        reason = (str(e) or type(e).__name__).splitlines()[0]
        raise InputError(f"{url}: the download is not a complete archive ({reason}); run again") from None


def extract(archive: Path, member_name: str, dest: Path) -> Path:
    """Copy the zip member whose file name is `member_name` to `dest`; its CRC is checked as it streams."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(archive) as z:
            member = next((m for m in z.namelist() if Path(m).name == member_name), None)
            if member is None:
                raise InputError(f"{archive}: has no member {member_name} (members: {z.namelist()[:5]})")
            with z.open(member) as src, atomic_output(dest) as out:
                while block := src.read(1 << 22):
                    out.write(block)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise InputError(f"{archive}: corrupt or truncated zip ({e}); delete it and download again") from None
    return dest


def paranmt(downloads: Path, local: Path | None = None) -> Path:
    """Path of para-nmt-50m.txt: the local file itself, extracted from a local zip, or downloaded."""
    if local is not None and not local.exists():
        raise InputError(f"{local}: PARANMT_LOCAL does not exist")
    if local is not None and local.suffix != ".zip":
        return local
    archive = local or fetch(PARANMT_URL, downloads / "para-nmt-50m.zip")
    return extract(archive, PARANMT_MEMBER, downloads / PARANMT_MEMBER)


def lid_model(downloads: Path, local: Path | None = None) -> Path:
    """Path of the fastText lid.176.bin model: LID_MODEL if given, else downloaded and test-loaded."""
    if local is not None:
        if not local.is_file():
            raise InputError(f"{local}: LID_MODEL does not exist")
        return local
    path = downloads / "lid.176.bin"
    if not path.is_file():
        tmp = fetch(LID_URL, downloads / ".lid.176.bin.unchecked")
        load_lid(tmp)  # a damaged model fails here, before it is put in place
        tmp.rename(path)
    return path


def opus(lang: str, downloads: Path, corpora: list[str] | None = None) -> Path:
    """Download and extract the paper's OPUS corpora for en-`lang` as Moses files under downloads/opus/<lang>/.

    A corpus that OPUS does not have for this pair (HTTP 404) is reported and skipped.
    """
    pair = "-".join(sorted(["en", lang]))
    out = downloads / "opus" / lang
    for corpus in corpora or list(OPUS_CORPORA):
        version, langs = OPUS_CORPORA[corpus]
        if langs is not None and lang not in langs:
            continue
        url = OPUS_URL.format(corpus=corpus, version=version, pair=pair)
        try:
            archive = fetch(url, downloads / "opus" / f"{corpus}-{version}.{pair}.txt.zip")
        except NotFound:
            print(f"[opus] {corpus} {version} has no {pair}: skipped", file=sys.stderr)
            continue
        for side in ("en", lang):
            extract(archive, f"{corpus}.{pair}.{side}", out / f"{corpus}.{pair}.{side}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paraphrastic.preprocess.download", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["paranmt", "lid", "opus"])
    p.add_argument("--downloads", type=Path, required=True, help="folder for downloaded files")
    p.add_argument("--local", type=Path, help="use this local file instead of downloading")
    p.add_argument("--lang", help="for opus: the language paired with English")
    p.add_argument("--corpora", nargs="*", choices=list(OPUS_CORPORA), help="for opus: a subset of the corpora")
    args = p.parse_args(argv)
    if args.what == "paranmt":
        path = paranmt(args.downloads, args.local)
    elif args.what == "lid":
        path = lid_model(args.downloads, args.local)
    else:
        if not args.lang:
            raise InputError("opus needs --lang")
        path = opus(args.lang, args.downloads, args.corpora)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main)())
