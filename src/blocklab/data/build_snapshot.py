"""Build the pinned Python-standard-library snapshot that ships as blocklab's default corpus.

Run once, by hand, from the interpreter whose standard library should be frozen::

    python -m blocklab.data.build_snapshot            # writes into src/blocklab/data/corpora/

The snapshot stands in for the CodeParrot Python-code data of *Simplifying Transformer Blocks*
(He & Hofmann, 2024, Sec. 5): real Python source, but available offline on every machine. The file
set of the live standard library changes between Python versions (distutils, lib2to3 ... go away
in 3.12), so the default corpus is this frozen copy, not the running interpreter's library.

What goes in: every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` except test suites
(directories ``test``, ``tests``, ``idle_test``), the ``encodings`` package (mostly generated
charmap tables) and ``site-packages``. Records are ``{"path", "text"}`` JSON lines sorted by path,
xz-compressed; a sidecar JSON records the Python version and the sha256 of the decompressed bytes,
which the loader checks. The second embedded corpus, English text, is built by `build_shakespeare.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import platform
import shutil
import sysconfig
from pathlib import Path

XZ_PRESET = 9 | lzma.PRESET_EXTREME  # every embedded corpus is packed alike
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "encodings", "site-packages", "__pycache__"})
CORPORA = Path(__file__).with_name("corpora")


def stdlib_files(root: Path) -> list[Path]:
    """The snapshot's files under `root`, sorted by their POSIX path relative to `root`."""
    files = [
        p for p in root.rglob("*.py")
        if p.is_file() and not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def build(out_dir: Path = CORPORA, root: Path | None = None) -> dict:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    version = platform.python_version()
    lines = []
    for path in stdlib_files(root):
        # Strict UTF-8: every file kept in 3.11's library (outside the tests) is UTF-8.
        text = path.read_bytes().decode("utf-8")
        lines.append(json.dumps({"path": path.relative_to(root).as_posix(), "text": text},
                                ensure_ascii=False) + "\n")
    raw = "".join(lines).encode("utf-8")
    name = f"python-stdlib-{version}.jsonl.xz"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / name).write_bytes(lzma.compress(raw, preset=XZ_PRESET))
    info = {
        "name": "python-stdlib",
        "file": name,
        "python_version": version,
        "documents": len(lines),
        "bytes": sum(len(json.loads(line)["text"].encode("utf-8")) for line in lines),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "licence": "PSF License Agreement for Python (see LICENSE-PSF)",
    }
    (out_dir / "python-stdlib.json").write_text(json.dumps(info, indent=2) + "\n")
    licence = root / "LICENSE.txt"
    if licence.exists():
        shutil.copyfile(licence, out_dir / "LICENSE-PSF")
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CORPORA)
    parser.add_argument("--stdlib", type=Path, default=None, help="default: this interpreter's")
    args = parser.parse_args()
    print(json.dumps(build(args.out, args.stdlib), indent=2))


if __name__ == "__main__":
    main()
