"""The baseline's guards: the unigram plateau (its loss, exit step, the report's warnings) and the
embedding's init and scale that decide how fast a small model leaves it.

References: the plateau's loss by hand from token counts, exit steps and warnings from curves written out
here, and the embedding against its definition (x = embed_scale * E[id]).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from blocklab import LanguageModel, ModelConfig
from blocklab.statistics.plateau import plateau_exit, run_health, spread_warnings, unigram_loss
from blocklab.util.errors import ConfigError


def test_unigram_loss_by_hand():
    """Training tokens [0, 0, 0, 1] in a vocabulary of 3: add-1/2 counts 3.5, 1.5, 0.5 of 5.5. Targets
    [[0, 1], [2, -100]] score -(ln 3.5 + ln 1.5 + ln 0.5 - 3 ln 5.5) / 3; -100 is not scored."""
    labels = [np.array([[0, 1]]), np.array([[2, -100]])]
    expected = -(math.log(3.5) + math.log(1.5) + math.log(0.5) - 3 * math.log(5.5)) / 3
    assert unigram_loss(np.array([0, 0, 0, 1]), iter(labels), 3) == pytest.approx(expected, abs=1e-12)


def test_plateau_exit_is_the_first_step_below_the_entropy_minus_the_margin():
    curve = [(0, 8.3), (50, 6.65), (100, 6.55), (150, 6.49), (200, 5.0)]
    assert plateau_exit(curve, 6.6) == 150  # 6.55 is not below 6.5; 6.49 is
    assert plateau_exit(curve, 6.6, margin=0.0) == 100
    assert plateau_exit(curve[:3], 6.6) is None


def test_run_health_flags_late_exits_and_ends_near_the_plateau():
    early = run_health([(0, 8.3), (50, 6.0), (400, 4.6)], 6.6, 400)
    assert early["exit_step"] == 50 and early["below"] == pytest.approx(2.0)
    assert not early["late"] and not early["near"]
    late = run_health([(0, 8.3), (200, 6.55), (250, 6.3), (400, 5.9)], 6.6, 400)
    assert late["exit_step"] == 250 and late["late"] and not late["near"]
    stuck = run_health([(0, 8.3), (400, 6.4)], 6.6, 400)
    assert stuck["exit_step"] == 400 and stuck["near"]
    never = run_health([(0, 8.3), (400, 6.58)], 6.6, 400)
    assert never["exit_step"] is None and never["late"] and never["near"]
    unknown = run_health([(0, 8.3), (400, 6.58)], None, 400)  # a run saved before the entropy was
    assert unknown["exit_step"] is None and not unknown["late"] and not unknown["near"]


def test_spread_warnings_name_differences_within_the_paired_seed_noise():
    """Paired by seed: sas - pre-ln = +0.06, -0.02 (mean +0.02, sd 0.0566) is noise; resformer's
    steady -0.03, -0.03 is not, though each architecture's own seeds are 0.1 apart."""
    finals = {"pre-ln": {0: 4.60, 1: 4.70}, "sas": {0: 4.66, 1: 4.68}, "resformer": {0: 4.57, 1: 4.67},
              "bov": {0: 4.20, 1: 4.22}, "one-seed": {0: 4.0}, "other-seeds": {2: 4.6, 3: 4.7}}
    lines = spread_warnings(finals)
    assert len(lines) == 1 and lines[0].startswith("`sas` - `pre-ln` = +0.0200")
    assert "(0.0566)" in lines[0]


def test_embed_scale_multiplies_the_token_embedding_only():
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("pre-ln", "tiny", n_layers=1, embed_scale=11.3, positions="sinusoidal")
    model = LanguageModel(cfg)
    ids = torch.tensor([[3, 7, 9]])
    positions = torch.arange(3)
    from blocklab.model.positions import sinusoidal_positions

    expected = 11.3 * model.tok_emb.weight[ids] + sinusoidal_positions(positions, cfg.d_model)
    torch.testing.assert_close(model.embed(model.tok_emb(ids), positions), expected)


def test_embed_init_std_sets_the_token_embeddings_spread():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig.from_preset("pre-ln", "tiny", n_layers=1, embed_init_std=1.0))
    assert model.tok_emb.weight.std().item() == pytest.approx(1.0, rel=0.02)
    assert model.block(0).mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)  # the rest: init_std


@pytest.mark.parametrize("fields,needle", [
    (dict(embed_scale=0.0), "embed_scale"),
    (dict(embed_scale=float("nan")), "embed_scale"),
    (dict(embed_init_std=-1.0), "embed_init_std"),
    (dict(embed_init_std=1.0, init_scheme="nanochat", tie_embeddings=False), "embed_init_std"),
])
def test_bad_embedding_settings_are_refused_by_name(fields, needle):
    with pytest.raises(ConfigError, match=needle):
        ModelConfig.from_preset("pre-ln", "tiny", **fields)


@pytest.mark.slow
def test_the_main_job_leaves_the_unigram_plateau_at_once(tmp_path):
    """Regression test against the crippled baseline: pre-ln at size tiny with the main job's
    recipe (its size preset and optimiser, the embedded corpus) is below the plateau U - 0.1 by the
    first validation after step 0 (50 steps, 102,400 tokens) and below U - 1 after 100 steps. With
    the old defaults (sinusoidal positions, AdamW 3e-3) the loss was still 6.63 > U - 0.1 = 6.49 at
    step 100 of the main job."""
    from blocklab.compare import resolve_compare, run_configs
    from blocklab.training import train
    from blocklab.training.metrics import read_metrics

    entries, base = resolve_compare(["pre-ln"], base={"size": "tiny", "eval_every": 50, "progress": False},
                                    budget={"steps": 100})
    [(_, cfg)] = run_configs(entries, 1, tmp_path, base)
    summary = train(cfg).summary
    plateau = summary["unigram_loss"]
    metrics = tmp_path / "runs" / "pre-ln-seed0" / "metrics.jsonl"
    curve = [(r["step"], r["val_loss"]) for r in read_metrics(metrics, "val")]
    assert plateau == pytest.approx(6.59, abs=0.05)  # the embedded corpus at BPE 4096
    assert plateau_exit(curve, plateau) == 50, curve
    assert summary["val_loss"] < plateau - 1.0, curve


def test_the_report_warns_on_late_exits_ends_near_the_plateau_and_noise_sized_differences():
    """`report.baseline_warnings` and `plateau_table` on rows written out here: U = 6.6, 400 steps."""
    from blocklab.report import baseline_warnings, plateau_table

    def row(label, curves):
        health = [{"seed": s, "final": c[-1][1], **run_health(c, 6.6, 400)} for s, c in enumerate(curves)]
        finals = [h["final"] for h in health]
        sd = None if len(finals) < 2 else float(np.std(finals, ddof=1))
        return {"label": label, "steps": 400, "plateau": health, "val_loss": [float(np.mean(finals)), sd]}

    rows = [row("pre-ln", [[(0, 8.3), (50, 6.0), (400, 4.60)], [(0, 8.3), (50, 6.1), (400, 4.70)]]),
            row("sas", [[(0, 8.3), (50, 6.2), (400, 4.66)], [(0, 8.3), (50, 6.0), (400, 4.68)]]),
            row("late", [[(0, 8.3), (200, 6.55), (300, 6.4), (400, 6.3)], [(0, 8.3), (400, 6.58)]])]
    warnings = baseline_warnings(rows)
    assert len(warnings) == 3, warnings
    late, near, noise = warnings
    assert "2 runs left the unigram plateau late" in late and "`late` seed 0 (step 300 of 400)" in late
    assert "`late` seed 1 (never in 400)" in late
    assert "`late` seed 0 (0.30 nats below)" in near and "`late` seed 1 (0.02 nats below)" in near
    assert noise.startswith("The seed spread is as large as the difference: `sas` - `pre-ln` = +0.0200")
    assert "(0.0566)" in noise  # the paired differences +0.06, -0.02
    assert "`late` - `pre-ln`" not in noise  # 1.79 nats apart: far outside the spread
    head, body = plateau_table(rows)
    assert head[1] == "unigram plateau U" and body[0] == ["pre-ln", "6.600", "50, 50", "2.00, 1.90", "0.0707"]
    assert body[2][2] == "300, never"
    assert baseline_warnings(rows[:1]) == []  # a healthy baseline alone: nothing to say
