"""Runs trained elsewhere brought into a comparison's report (`--add`), once checked to share its
data, tokenizer and held-out windows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blocklab.compare.grids import Entry
from blocklab.training import TrainConfig
from blocklab.util.errors import ConfigError

# What an added run must share with the comparison's runs for its losses to be read against theirs:
# the held-out windows are a function of the data, the tokenizer and these fields.
WINDOW_FIELDS = ("batch_size", "seq_len", "eval_batches", "data.objective", "data.mask_prob")


def _manifest(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "data_manifest.json").read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--add {run}: its data_manifest.json cannot be read ({err}), so it cannot be "
                          "checked against this comparison's data.") from None


def data_differences(ours: Path, theirs: Path) -> list[str]:
    """How run `theirs` differs from run `ours` in what fixes the held-out windows: the data (the
    source's fingerprint, its settings, the validation split), the tokenizer, and WINDOW_FIELDS."""
    from blocklab.training.config import flat, read_yaml

    a, b = _manifest(ours), _manifest(theirs)
    out = []
    if a["source"].get("fingerprint") != b["source"].get("fingerprint"):
        out.append(f"data source ({a['source'].get('description')} against {b['source'].get('description')})")
    settings = sorted(k for k in a["settings"].keys() | b["settings"].keys()
                      if a["settings"].get(k) != b["settings"].get(k))
    out += [f"data.{k} ({a['settings'].get(k)!r} against {b['settings'].get(k)!r})" for k in settings]
    if a["tokenizer"]["hash"] != b["tokenizer"]["hash"]:
        out.append("tokenizer (tokenizer.json differs)")
    if a["splits"]["val"] != b["splits"]["val"]:
        out.append("validation split (its documents or tokens differ)")
    ca, cb = flat(read_yaml(ours / "config.yaml")), flat(read_yaml(theirs / "config.yaml"))
    out += [f"{k} ({ca.get(k)!r} against {cb.get(k)!r})" for k in WINDOW_FIELDS if ca.get(k) != cb.get(k)]
    return out


def require_finished(run: Path) -> None:
    if not (run / "summary.json").is_file():
        raise ConfigError(f"--add {run}: not a finished run (no summary.json); give a run directory "
                          "that `blocklab train` or a compare finished.")


def added_runs(paths: list[str | Path], configs: list[tuple[Entry, TrainConfig]]
               ) -> list[tuple[Entry, TrainConfig]]:
    """Runs trained elsewhere (`blocklab train`, another compare, another machine) brought into this
    comparison's report. Each must be finished and share the data, tokenizer and held-out windows of the
    comparison's runs (`data_differences`; refused with the differences named otherwise). A run whose
    config matches one of the entries' apart from its seed (and where it lives) joins that entry as
    another seed; any other run (a longer budget, another rate) is an entry of its own, labelled with
    its folder."""
    from blocklab.training.config import NOT_RESULTS, changed_fields, read_yaml

    ours = Path(configs[0][1].out_dir)
    added: list[tuple[Entry, TrainConfig]] = []
    for path in paths:
        run = Path(path)
        require_finished(run)
        differences = data_differences(ours, run)
        if differences:
            raise ConfigError(f"--add {run} cannot join this report: it differs from {ours} in "
                              f"{'; '.join(differences)}. Only runs on the same data, tokenizer and held-out "
                              "windows can be compared with these.")
        cfg = TrainConfig.from_dict({**read_yaml(run / "config.yaml"), "out_dir": str(run)})
        joined = next((e for e, c in configs if e.arch == cfg.arch and not changed_fields(
            c, cfg, NOT_RESULTS | {"seed"})), None)
        entry = joined or Entry(f"{cfg.arch} ({run.name})", cfg.arch)
        taken = [c.seed for e, c in configs + added if e.label == entry.label]
        if cfg.seed in taken:
            raise ConfigError(f"--add {run}: `{entry.label}` already has a run of seed {cfg.seed}; add "
                              "another seed, or a run that differs in more than its seed.")
        added.append((entry, cfg))
    return added
