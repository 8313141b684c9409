"""How much of blocklab a reader walks through to follow a model from its config to its logits.

For each architecture, a profiler records every blocklab function that runs from
``ModelConfig.from_preset`` through building the model (config checks, presets, init) to the logits of
``model(ids)`` (no cache, no padding, CPU, size tiny at 2 layers), after one warm-up pass of the same
steps (so that one-time imports and caches are not counted). A function that runs is code the reader
follows, counted once, from its first to its last line; a comprehension, generator expression or
lambda inside it is part of those lines (Python < 3.12 runs each as a code object of its own, which
is not counted again); module-level code is left out. The registry
(model/value_paths/__init__.py), which says which value path a config builds, is counted too. A
second path, "forward pass", counts only ``model(ids)`` of a model already built (no config, presets,
checks or init): what a reader of the equations follows once the model exists.

Two classes: `blocklab.model.Transformer`, the definition a reader of the papers' equations reads, and
`blocklab.runtime.LanguageModel`, the same network with what runs it (what every command builds). The
table gives the files reached, their whole lengths, and the lines of the functions that ran.

    python benchmarks/reading_path.py [--archs pre-ln,sas-p+resformer]
        [--out benchmarks/results/reading-path.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

SRC = Path(__file__).resolve().parents[1] / "src"
REGISTRY = SRC / "blocklab" / "model" / "value_paths" / "__init__.py"


PATHS = ("config to logits", "forward pass")


def reading_path(arch: str, runnable: bool = False, path: str = PATHS[0]) -> dict:
    from blocklab import LanguageModel, ModelConfig, Transformer

    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    cls = LanguageModel if runnable else Transformer
    def build() -> torch.nn.Module:
        return cls(ModelConfig.from_preset(arch, "tiny", n_layers=2, vocab_size=64)).eval()

    built = build() if path == "forward pass" else None

    def config_to_logits() -> None:
        (built if built is not None else build())(ids)

    ran: dict[str, dict[int, int]] = defaultdict(dict)  # file -> first line of a code object -> its last

    def profile(frame, event, _arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(str(SRC)):
            if code.co_firstlineno not in ran[code.co_filename]:
                try:
                    lines = len(inspect.getsourcelines(code)[0])
                except OSError:
                    lines = 0
                ran[code.co_filename][code.co_firstlineno] = code.co_firstlineno + lines - 1

    with torch.no_grad():
        config_to_logits()  # the warm-up
        sys.setprofile(profile)
        try:
            config_to_logits()
        finally:
            sys.setprofile(None)
    files = sorted(set(ran) | ({str(REGISTRY)} if path == PATHS[0] else set()))
    rows = {Path(f).relative_to(SRC).as_posix(): {"file_lines": len(Path(f).read_text().splitlines()),
                                                   **outermost(ran.get(f, {}))}
            for f in files}
    return {"arch": arch, "class": cls.__name__, "path": path, "files": rows, "n_files": len(rows),
            "file_lines": sum(r["file_lines"] for r in rows.values()),
            "function_lines": sum(r["function_lines"] for r in rows.values())}


def outermost(spans: dict[int, int]) -> dict[str, int]:
    """The functions among code objects (first line -> last line) that lie in no other one, and their
    lines: a comprehension or lambda inside a function that ran is counted with it, once."""
    functions = lines = 0
    end = 0
    for first, last in sorted(spans.items()):
        if first > end:  # not inside the last outer function counted
            functions, lines, end = functions + 1, lines + last - first + 1, last
    return {"functions": functions, "function_lines": lines}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="pre-ln,sas-p+resformer")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "reading-path.json"))
    opts = parser.parse_args(argv)
    results = [reading_path(arch, runnable, path) for arch in opts.archs.split(",") for path in PATHS
               for runnable in (False, True)]
    print("| arch | class | path | files | whole files' lines | lines of the functions that ran |")
    print("|---|---|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['arch']} | {r['class']} | {r['path']} | {r['n_files']} | {r['file_lines']} "
              f"| {r['function_lines']} |")
    for r in results:
        print(f"\n{r['arch']} ({r['class']}, {r['path']}):")
        for name, row in r["files"].items():
            print(f"  {row['file_lines']:5d} lines, {row['functions']:3d} functions ran "
                  f"({row['function_lines']} lines)  {name}")
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
