"""Small configs, models and run settings shared by the tests."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

import reference as R
from blocklab import LanguageModel, ModelConfig
from blocklab.model.presets import BLOCK_PRESETS

PRESETS = list(BLOCK_PRESETS)
CAUSAL_PRESETS = PRESETS  # every block preset is causal unless causal=False is set
SMALL = dict(n_layers=3, d_model=32, n_heads=4, vocab_size=50, context_length=16, mlp_hidden=64)
T = 16

# attention masks: causal, sliding window on some layers (layer 0 "S", then "L"; the last layer is
# always full context), bidirectional, and bidirectional with windows
MASKS = {
    "causal": {},
    "window": dict(window_size=4, window_pattern="SL"),
    "bidirectional": dict(causal=False),
    "bidirectional-window": dict(causal=False, window_size=3, window_pattern="S"),
}

# Model-level comparisons in float64. The model computes sinusoidal / rotary angles and the
# masked-mean prefix sums of shaped attention in float32 (model/test_ops.py::
# test_float64_inputs_are_computed_in_float64), which leaves ~1e-6 differences on logits of size
# ~20; a structural error (a wrong mask, gain, norm, head order ...) changes them by >= 1e-2.
TOL = dict(rtol=1e-5, atol=1e-5)


def make_cfg(arch: str = "pre-ln", **overrides) -> ModelConfig:
    return ModelConfig.from_preset(arch, "tiny", **{**SMALL, **overrides})


def make_model(arch: str = "pre-ln", seed: int = 0, perturbed: bool = True, **overrides) -> LanguageModel:
    torch.manual_seed(seed)
    model = LanguageModel(make_cfg(arch, **overrides)).double()
    if perturbed:
        R.perturb(model, seed=seed + 100)
    return model


def tokens(batch: int = 2, t: int = T, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, t), generator=torch.Generator().manual_seed(seed))


def padded_prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 6 and 4 tokens (ids, attention mask), the second left-padded by two positions."""
    ids = torch.randint(1, vocab, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids.masked_fill(mask == 0, 0), mask


def write_code_corpus(root: Path) -> Path:
    """Twelve small Python files: a corpus a byte-level run of a few steps trains on."""
    for i in range(12):
        (root / f"m{i}.py").write_text("".join(f"x{j % 7} = y{(i + j) % 5} + {j}\n" for j in range(120)))
    return root


def small_run_args(corpus: Path, cache: Path) -> list[str]:
    """`blocklab train` overrides of a run that takes a second: bytes of `corpus`, d 32 x 2 layers,
    batches of 2 x 16 tokens, no progress bar."""
    return [f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={cache}", "model.d_model=32",
            "model.n_layers=2", "model.n_heads=2", "batch_size=2", "seq_len=16", "progress=false"]


def digest(folder: Path) -> dict[str, str]:
    """The sha256 of every file under `folder`, by its path in it (what a refused command must leave as
    it was)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys) -> str:
    """What the command just run wrote to stderr, checked to be one `blocklab: error:` line."""
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def compare_base(corpus: Path, cache: Path, steps: int = 4) -> dict:
    """TrainConfig fields of a compare that takes seconds: size tiny cut to d 32 x 3 layers, batches of
    4 x 32 bytes, validation and a checkpoint every 2 steps on 2 held-out batches."""
    return {"size": "tiny", "batch_size": 4, "seq_len": 32, "max_steps": steps, "eval_every": 2,
            "eval_batches": 2, "log_every": 1, "ckpt_every": 2, "progress": False,
            "model": {"d_model": 32, "n_layers": 3, "n_heads": 2},
            "data": {"source": str(corpus), "tokenizer": "byte", "cache_dir": str(cache)}}


def saved_figures(monkeypatch) -> list:
    """The matplotlib figures saved from now on, in order (blocklab draws on `Figure` objects without
    pyplot, so a test reads what a plot drew from the figure its `savefig` was called on)."""
    from matplotlib.figure import Figure

    figures: list = []
    save = Figure.savefig

    def record(fig, *args, **kwargs):
        figures.append(fig)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return figures


def write_law_run(run: Path, n: float, scale: float, offset: float, loss: float, config=None) -> None:
    """A finished ladder run written from a known law, no training: `n` parameters, final `loss`, and four
    validations on a curve that reaches a loss `scale` times sooner in tokens (plus the seed's `offset`);
    with `config` (a TrainConfig) its config.yaml too, for the store's check of each run's config."""
    import json

    import yaml

    run.mkdir(parents=True)
    tokens = [1e5 * k for k in range(1, 5)]
    curve = [2.6 + 30 * (t * scale) ** -0.35 + offset for t in tokens]
    rows = [{"kind": "val", "tokens": t, "val_loss": v} for t, v in zip(tokens, curve, strict=True)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps(
        {"params": {"total": int(n), "non_embedding": int(0.6 * n)}, "val_loss": loss}))
    if config is not None:
        (run / "config.yaml").write_text(yaml.safe_dump(config.to_dict()))
