"""Print each requirement of pyproject.toml (dependencies, the dev and hf4 extras) beside the version this
environment holds: the floors tier's table (.ci/floors.sh, docs/setup.md)."""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10, which blocklab allows: tomllib is 3.11's (pip install tomli)
    import tomli as tomllib

project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
extras = project["optional-dependencies"]
requirements = [*project["dependencies"], *extras["dev"], *extras["hf4"]]  # hf4: the 4.x venv's bounds
print(f"python {sys.version.split()[0]}")
print(f"{'package':<16} {'declared':<12} installed")
for requirement in requirements:
    name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", requirement).groups()
    try:
        have = version(name)
    except PackageNotFoundError:
        have = "(not installed)"
    print(f"{name:<16} {spec:<12} {have}")
