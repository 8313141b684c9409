"""Diagnostics (blocklab.analysis): each statistic against a hand computation, the hooks against what
the model computes on its own fused path and against the naive float64 reference, flags restored,
bad input, and the report files end to end on a model trained a few steps."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from matplotlib import image as mpimg

import reference as R
from blocklab import LanguageModel, ModelConfig
from blocklab.analysis import (
    compare_reports,
    diagnose,
    diagnostic_mode,
    importance_entropy,
    normalized_spectrum,
    plot_scalars,
    scalar_series,
    token_importance,
    token_norms,
    token_similarity,
    trace,
    value_spectrum,
    write_report,
)
from blocklab.model.gains import is_gain
from helpers import make_model, tokens

F64 = dict(dtype=torch.float64)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# -- the statistics ---------------------------------------------------------------------------------
def test_uniform_attention_has_entropy_log_t():
    t = 7
    attn = torch.full((2, 3, t, t), 1.0 / t)
    torch.testing.assert_close(importance_entropy(attn), torch.full((2, 3), math.log(t), **F64))


def test_a_sink_has_entropy_zero():
    attn = torch.zeros(5, 5)
    attn[:, 0] = 1.0  # every query attends only to the first token
    torch.testing.assert_close(token_importance(attn), torch.tensor([1.0, 0, 0, 0, 0], **F64))
    assert importance_entropy(attn).item() == 0.0


def test_entropy_of_a_causal_matrix_by_hand():
    attn = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], **F64)
    # a_j = (1/3) sum_i A_ij = (1.7, 0.8, 0.5) / 3, which already sums to 1
    p = [1.7 / 3, 0.8 / 3, 0.5 / 3]
    expected = -sum(x * math.log(x) for x in p)
    torch.testing.assert_close(token_importance(attn), torch.tensor(p, **F64))
    assert importance_entropy(attn).item() == pytest.approx(expected, rel=1e-12)
    # a' is normalised: rows that sum to 2 give the same importance
    assert importance_entropy(2 * attn).item() == pytest.approx(expected, rel=1e-12)


def test_importance_refuses_negative_entries():
    with pytest.raises(ValueError, match="non-negative"):
        token_importance(torch.tensor([[1.0, -0.5], [0.5, 1.0]]))


def test_similarity_of_identical_tokens_is_one_and_of_orthogonal_tokens_zero():
    h = torch.randn(1, 8).repeat(6, 1) * torch.arange(1.0, 7.0)[:, None]  # same direction, any length
    assert token_similarity(h).item() == pytest.approx(1.0, abs=1e-12)
    assert token_similarity(torch.eye(5)).item() == pytest.approx(0.0, abs=1e-12)


def test_similarity_by_hand_and_against_the_pairwise_loop():
    h = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    # ordered pairs: cos = 1/sqrt2 (x2), 0 (x2), 1/sqrt2 (x2); 6 pairs
    assert token_similarity(h).item() == pytest.approx(4 / math.sqrt(2) / 6, rel=1e-12)
    x = torch.randn(2, 5, 3, **F64)
    for b in range(2):
        pairs = [F.cosine_similarity(x[b, i], x[b, j], dim=0) for i in range(5) for j in range(5) if i != j]
        assert token_similarity(x)[b].item() == pytest.approx(sum(pairs).item() / 20, rel=1e-10)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        token_similarity(torch.randn(1, 4))


def test_spectrum_of_a_known_matrix():
    v = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # (1/2)(v1 v1^T + v2 v2^T) = diag(2, 0.5)
    torch.testing.assert_close(value_spectrum(v), torch.tensor([2.0, 0.5], **F64))
    torch.testing.assert_close(normalized_spectrum(value_spectrum(v)), torch.tensor([0.8, 0.2], **F64))
    c, s = math.cos(0.3), math.sin(0.3)  # a rotation of the feature space keeps the eigenvalues
    rotated = v @ torch.tensor([[c, -s], [s, c]])
    torch.testing.assert_close(value_spectrum(rotated), torch.tensor([2.0, 0.5], **F64))


@pytest.mark.parametrize("shape", [(3, 4, 6), (2, 9, 5)])  # l < d uses the Gram matrix, l >= d not
def test_spectrum_matches_numpy_on_the_second_moment(shape):
    v = torch.randn(shape, **F64)
    for b in range(shape[0]):
        x = v[b].numpy()
        expected = np.sort(np.linalg.eigvalsh(x.T @ x / x.shape[0]))[::-1].clip(min=0)
        np.testing.assert_allclose(value_spectrum(v)[b].numpy(), expected, atol=1e-12)


def test_norms_by_hand():
    x = torch.tensor([[[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]]])
    torch.testing.assert_close(token_norms(x), torch.tensor([[5.0, 0.0, 1.0]], **F64))


# -- the hooks read what the model computes ---------------------------------------------------------
def _proj_inputs(model, ids):
    """The input of every layer's output projection on the model's normal (fused) path."""
    seen = {}
    hooks = [b.attn.proj.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0]))
             for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        logits = model(ids)
    for h in hooks:
        h.remove()
    return seen, logits


@pytest.mark.parametrize("arch,overrides", [
    ("pre-ln", {}), ("sas", {}), ("shaped", dict(n_kv_heads=2)), ("pre-ln+cla", dict(n_kv_heads=2)),
    ("pre-ln", dict(window_size=4, window_pattern="SL")),
    ("sas", dict(causal=False, window_size=3, window_pattern="S"))])
def test_captured_matrix_times_values_is_the_attention_output(arch, overrides):
    model = make_model(arch, **overrides)  # float64, every parameter perturbed away from its init
    ids = tokens()
    assert not any(b.attn.explicit for b in model.blocks)
    expected, logits = _proj_inputs(model, ids)
    with diagnostic_mode(model):
        traces = trace(model, ids)
    b, t = ids.shape
    for i, (block, tr) in enumerate(zip(model.blocks, traces, strict=True)):
        attn = block.attn
        allowed = R.mask_matrix(t, t, model.cfg.causal, R.layer_window(model.cfg, i))
        heads = tr.v.view(b, t, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
        heads = heads.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
        y = (tr.matrix @ heads).transpose(1, 2).reshape(b, t, -1)
        torch.testing.assert_close(y, expected[i], rtol=1e-9, atol=1e-9)
        # the matrices against the naive float64 reference, head by head
        gains = attn.matrix_gains() if attn.form != "softmax" else (None, None, None)
        for h in range(attn.n_heads):
            k = tr.k[:, h // (attn.n_heads // attn.n_kv_heads)]
            probs = R.attention_matrix(tr.q[:, h], k, allowed, "softmax")
            torch.testing.assert_close(tr.probs[:, h], probs, rtol=1e-9, atol=1e-9)
            matrix = R.attention_matrix(tr.q[:, h], k, allowed, attn.form, *gains, h=h)
            torch.testing.assert_close(tr.matrix[:, h], matrix, rtol=1e-9, atol=1e-9)
    # the captured hidden state of the last block is what the head reads
    torch.testing.assert_close(model.logits(traces[-1].hidden), logits)
    # a shaped matrix is not the softmax: the test above did compare two different things
    if model.cfg.attn_matrix == "shaped":
        assert (traces[0].matrix - traces[0].probs).abs().max() > 0.1


def _flags(model):
    return [b.attn.explicit for b in model.blocks], [m.training for m in model.modules()]


def test_diagnostic_mode_and_diagnose_restore_flags_also_on_error():
    model = make_model("sas", perturbed=False)
    model.train()
    model.blocks[1].attn.explicit = True
    model.blocks[0].mlp.eval()  # a mixed state must come back as it was
    before = _flags(model)
    with diagnostic_mode(model):
        assert all(b.attn.explicit for b in model.blocks)
        assert not model.training and not torch.is_grad_enabled()
    assert _flags(model) == before and torch.is_grad_enabled()

    diagnose(model, [tokens()])
    assert _flags(model) == before

    def failing_loader():
        yield tokens()
        raise RuntimeError("loader broke")

    with pytest.raises(RuntimeError, match="loader broke"):
        diagnose(model, failing_loader())
    assert _flags(model) == before
    with pytest.raises(ValueError, match="LongTensor"):
        diagnose(model, [tokens(), tokens().double()])
    assert _flags(model) == before
    assert not any(m._forward_hooks for m in model.modules())


def test_bad_input_is_refused_with_a_clear_message():
    model = make_model("pre-ln", perturbed=False)
    ids = tokens()
    cases = [
        (dict(batches=[ids], layers=[3]), r"layers = \[3\] is not allowed.*\[0, 3\)"),
        (dict(batches=[ids], heads=[4]), r"heads = \[4\] is not allowed.*\[0, 4\)"),
        (dict(batches=[ids], max_batches=0), "max_batches"),
        (dict(batches=[]), "no batches"),
        (dict(batches=[ids[0]]), "LongTensor of token ids"),
        (dict(batches=[ids + 50]), r"token ids must lie in \[0, 50\)"),
        (dict(batches=[ids, ids[:, :8]]), "same sequence length"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            diagnose(model, **kwargs)
    with pytest.raises(ValueError, match="not a diagnose"):
        write_report({"meta": {}}, "unused")


def test_diagnose_notes_the_layers_that_attend_over_another_layers_keys():
    """Cross-layer attention's layers n >= 1 attend over [K_n; K_1]: their maps are of their own keys only."""
    notes = diagnose(make_model("pre-ln+cross-layer-attn"), [tokens(2)])["notes"]
    assert [note.split(":")[0] for note in notes] == ["layer 1", "layer 2"]  # helpers' models: 3 layers
    assert diagnose(make_model("pre-ln"), [tokens(2)])["notes"] == []


def test_diagnose_averages_per_sequence_statistics_over_batches():
    model = make_model("pre-ln")
    batches = [tokens(3, seed=1), tokens(1, seed=2)]  # unequal batches: weights are per sequence
    r = diagnose(model, batches, layers=[0, 2], heads=[1], map_tokens=8)
    with diagnostic_mode(model):
        traces = trace(model, torch.cat(batches))  # the same 4 sequences in one batch
    assert r["meta"]["sequences"] == 4 and r["meta"]["seq_len"] == 16
    assert r["entropy"]["max"] == pytest.approx(math.log(16))
    # uniform causal attention: key j is seen by queries i >= j, a_j = (1/T) sum_{i >= j} 1 / (i + 1)
    a = [sum(1 / (i + 1) for i in range(j, 16)) / 16 for j in range(16)]
    assert r["entropy"]["uniform_attention"] == pytest.approx([-sum(x * math.log(x) for x in a)] * 3)
    for i, tr in enumerate(traces):
        per_head = importance_entropy(tr.probs).mean(0)
        assert r["entropy"]["per_head"][i] == pytest.approx(per_head.tolist(), rel=1e-9)
        assert r["entropy"]["mean"][i] == pytest.approx(per_head.mean().item(), rel=1e-9)
        importance = token_importance(tr.probs).mean((0, 1))
        assert r["importance"]["per_position"][i] == pytest.approx(importance.tolist(), rel=1e-9)
        assert r["importance"]["first_token"][i] == pytest.approx(importance[0].item(), rel=1e-9)
        assert r["importance"]["other_tokens"][i] == pytest.approx(importance[1:].mean().item(), rel=1e-9)
        assert r["value_norm"]["first_token"][i] == pytest.approx(tr.v[:, 0].norm(dim=-1).mean().item())
        assert r["hidden_norm"]["per_position"][i] == pytest.approx(
            tr.hidden.norm(dim=-1).mean(0).tolist(), rel=1e-9)
        assert r["similarity"][i] == pytest.approx(token_similarity(tr.hidden).mean().item(), rel=1e-9)
        eig = value_spectrum(tr.v)
        assert r["spectrum"]["eigenvalues"][i] == pytest.approx(eig.mean(0).tolist(), rel=1e-9, abs=1e-12)
        assert r["spectrum"]["max"][i] == pytest.approx(eig[:, 0].mean().item(), rel=1e-9)
    maps = r["attention_maps"]
    assert [(m["layer"], m["head"], m["kind"], m["size"]) for m in maps] == [
        (0, 1, "softmax", 8), (2, 1, "softmax", 8)]
    expected = traces[2].probs[:, 1, :8, :8].mean(0)
    np.testing.assert_allclose(np.asarray(maps[1]["values"]), expected.numpy(), atol=1e-6)


# -- learned scalars ----------------------------------------------------------------------------------
def _write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_scalar_series_groups_as_the_papers_plot_them(tmp_path):
    scalars = {"blocks.0.attn.alpha": [1.0, 2.0, 3.0], "blocks.0.attn.values.w_v.skip": [2.0],
               "blocks.0.attn.values.w_v.resid": [0.5], "blocks.1.attn.values.lambda1": [0.7],
               "blocks.2.attn.values.coef": [1.2], "value_shared.dwa.0": [0.1, 0.9],
               "value_shared.scale": [4.0]}
    records = [{"kind": "train", "step": 10, "loss": 3.0, "scalars": scalars},
               {"kind": "val", "step": 10, "val_loss": 3.1, "val_bpb": 1.0},
               {"kind": "train", "step": 15, "loss": 2.9},  # no scalars logged: skipped
               {"kind": "train", "step": 20, "loss": 2.5,
                "scalars": {"blocks.0.attn.alpha": [2.0, 2.0, 2.0]}}]
    series = scalar_series(records)
    assert series["steps"] == [10, 20]
    panels = series["panels"]
    alpha = panels["shaped attention alpha (on I)"]
    assert alpha["lines"]["L0"] == [2.0, 2.0]
    assert alpha["bands"]["L0"] == pytest.approx([math.sqrt(2 / 3), 0.0])
    ratio = panels["beta_V / alpha_V (value reparam, Simplifying Fig. 4)"]["lines"]["L0"]
    assert ratio[0] == 0.25 and math.isnan(ratio[1])  # missing at step 20
    assert panels["ResFormer lambda_1 (weight on V_1)"]["lines"]["L1"][0] == 0.7
    assert panels["Bank of Values gamma_v"]["lines"]["L2"][0] == 1.2
    assert set(panels["DenseFormer weights"]["lines"]) == {"L0[0]", "L0[1]"}
    per_head = panels["shaped attention alpha (on I), per head"]["lines"]  # the issue asks per head
    assert per_head == {"L0.h0": [1.0, 2.0], "L0.h1": [2.0, 2.0], "L0.h2": [3.0, 2.0]}
    assert panels["value_shared.scale"]["lines"]["value_shared.scale"][0] == 4.0

    path = _write_jsonl(tmp_path / "metrics.jsonl", records)
    assert json.dumps(plot_scalars(path, tmp_path / "scalars.png")) == json.dumps(series)  # NaN != NaN
    assert (tmp_path / "scalars.png").read_bytes()[:8] == PNG_SIGNATURE
    with pytest.raises(ValueError, match="no train records with learned scalars"):
        plot_scalars(_write_jsonl(tmp_path / "empty.jsonl", records[1:3]), tmp_path / "x.png")
    (tmp_path / "bad.jsonl").write_text('{"kind": "train"}\nnot json\n{"kind": "train"}\n')  # not a torn end
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        plot_scalars(tmp_path / "bad.jsonl", tmp_path / "x.png")


# -- end to end ---------------------------------------------------------------------------------------
TINY = dict(n_layers=2, d_model=32, n_heads=2, vocab_size=64, context_length=16, mlp_hidden=64)


def _train_a_few_steps(model, steps, metrics):
    """AdamW on random tokens, logging the gains the way the trainer does."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        ids = torch.randint(0, 64, (4, 16), generator=gen)
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics.append({"kind": "train", "step": step, "tokens": step * 64, "loss": loss.item(), "lr": 1e-2,
                        "grad_norm": 1.0, "tokens_per_s": 1.0, "wall_time": float(step),
                        "scalars": {n[: -len(".gain")]: p.tolist() for n, p in model.named_parameters()
                                    if is_gain(n)}})
    metrics.append({"kind": "val", "step": steps, "tokens": steps * 64, "val_loss": 4.0, "val_bpb": 1.5})


def _check_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    pixels = mpimg.imread(path)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) > 100 and pixels.std() > 0, path


def test_report_end_to_end(tmp_path):
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig.from_preset("sas", "tiny", **TINY))
    metrics = []
    _train_a_few_steps(model, 4, metrics)
    metrics_path = _write_jsonl(tmp_path / "metrics.jsonl", metrics)
    gen = torch.Generator().manual_seed(1)
    held_out = [torch.randint(0, 64, (2, 16), generator=gen) for _ in range(3)]

    results = diagnose(model, held_out, heads=[0, 1], max_batches=2)
    assert model.training  # restored
    assert results["meta"]["sequences"] == 4
    assert json.loads(json.dumps(results)) == results  # JSON-able as it is
    n = 2
    assert len(results["entropy"]["mean"]) == len(results["similarity"]) == n
    assert len(results["entropy"]["per_head"][0]) == 2
    for key in ("importance", "value_norm", "hidden_norm"):
        assert set(results[key]) - {"uniform_attention"} == {"first_token", "other_tokens", "per_position"}
        assert np.asarray(results[key]["per_position"]).shape == (n, 16)
    assert np.asarray(results["spectrum"]["normalized"]).shape == (n, 32)
    assert np.asarray(results["spectrum"]["normalized"]).sum(1) == pytest.approx([1.0, 1.0])
    kinds = {(m["layer"], m["head"], m["kind"]) for m in results["attention_maps"]}
    assert kinds == {(i, h, k) for i in range(n) for h in range(2) for k in ("softmax", "matrix")}

    files = write_report(results, tmp_path / "report", metrics_path=metrics_path)
    names = {f.name for f in files}
    assert names == {"diagnostics.json", "entropy.png", "first_token.png", "positions.png", "similarity.png",
                     "spectrum.png", "attention_softmax.png", "attention_matrix.png", "scalars.png",
                     "summary.md"}
    for f in files:
        if f.suffix == ".png":
            _check_png(f)
    assert json.loads((tmp_path / "report" / "diagnostics.json").read_text()) == results
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "| 1 |" in summary and "beta_V / alpha_V" in summary and "last val loss 4" in summary

    # the learned ratio beta_V / alpha_V of layer 0 (the only reparameterised W_V in SAS), by hand
    series = plot_scalars(metrics_path, tmp_path / "scalars.png")
    last = metrics[-2]["scalars"]
    ratio = last["blocks.0.attn.values.w_v.resid"][0] / last["blocks.0.attn.values.w_v.skip"][0]
    assert series["panels"]["beta_V / alpha_V (value reparam, Simplifying Fig. 4)"]["lines"]["L0"][-1] == (
        pytest.approx(ratio))
    assert ratio != pytest.approx(1.0)  # trained away from its initial value

    other = diagnose(LanguageModel(ModelConfig.from_preset("pre-ln+resformer", "tiny", **TINY)), held_out,
                     layers=[1], max_batches=1)
    out = compare_reports(tmp_path / "report", other, tmp_path / "compare", labels=("sas", "resformer"))
    assert [f.name for f in out] == ["compare.png", "compare.json", "compare.md"]
    _check_png(out[0])
    compared = json.loads(out[1].read_text())
    assert compared["labels"] == ["sas", "resformer"]
    assert compared["series"]["resformer"]["entropy"] == other["entropy"]["mean"]


# -- the uniform-attention references -----------------------------------------------------------------
def test_first_token_reference_is_h_t_over_t_and_what_uniform_attention_gives():
    from blocklab.analysis.diagnose import uniform_importance

    t = 16
    harmonic = sum(1 / k for k in range(1, t + 1))
    model = make_model("pre-ln", n_layers=2)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q.weight.zero_()  # every logit 0: uniform causal attention
    ref = uniform_importance(model.blocks[0].attn, t)
    assert ref["first_token"] == pytest.approx(harmonic / t, rel=1e-12)
    assert ref["other_tokens"] == pytest.approx((1 - harmonic / t) / (t - 1), rel=1e-12)
    results = diagnose(model, [tokens(t=t)])
    uniform = results["importance"]["uniform_attention"]
    assert uniform["first_token"] == pytest.approx([harmonic / t] * 2, rel=1e-12)
    assert results["importance"]["first_token"] == pytest.approx(uniform["first_token"], rel=1e-9)
    bidirectional = make_model("pre-ln", causal=False).blocks[0].attn
    assert uniform_importance(bidirectional, t)["first_token"] == pytest.approx(1 / t)


# -- run directories: diagnose_run, the CLI ----------------------------------------------------------
EOS = 256  # the byte tokenizer's separator comes after the 256 bytes


def test_held_out_windows_start_where_asked_and_are_never_masked():
    from blocklab.analysis import held_out_windows

    stream = np.array([1, 2, 3, EOS, 4, 5, 6, 7, EOS, 8, 9, EOS, 10, 11, 12, 13, EOS])
    rows = lambda batches: [r.tolist() for b in batches for r in b]  # noqa: E731
    assert rows(held_out_windows(stream, 4, start="window")) == [[1, 2, 3, EOS], [4, 5, 6, 7],
                                                                  [EOS, 8, 9, EOS], [10, 11, 12, 13]]
    assert rows(held_out_windows(stream, 4, start="document", eos_id=EOS)) == [
        [1, 2, 3, EOS], [4, 5, 6, 7], [8, 9, EOS, 10], [10, 11, 12, 13]]
    assert rows(held_out_windows(stream, 4, start="separator", eos_id=EOS)) == [
        [EOS, 4, 5, 6], [EOS, 8, 9, EOS], [EOS, 10, 11, 12]]
    batches = held_out_windows(stream, 4, batch_size=2, max_batches=1, start="document", eos_id=EOS)
    assert len(batches) == 1 and batches[0].shape == (2, 4) and batches[0].dtype == torch.long
    with pytest.raises(ValueError, match="start"):
        held_out_windows(stream, 4, start="bos")
    with pytest.raises(ValueError, match="no window of 20 tokens"):
        held_out_windows(stream, 20)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs trained two steps each: SAS and Pre-LN (T = 32), Pre-LN at T = 16, a masked-LM encoder."""
    from blocklab.training import train

    root = tmp_path_factory.mktemp("diag")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"m{i}.py").write_text("".join(f"x{j % 7} = y{(i + j) % 5} + {j}\n" for j in range(12)))

    def run(name, arch, seq_len=32, objective="clm"):
        return train({"arch": arch, "size": "tiny", "batch_size": 4, "seq_len": seq_len, "max_steps": 2,
                      "eval_every": 0, "eval_batches": 1, "log_every": 1, "progress": False,
                      "model": {"d_model": 32, "n_layers": 2, "n_heads": 2},
                      "data": {"source": str(corpus), "tokenizer": "byte", "cache_dir": str(root / "cache"),
                               "val_fraction": 0.3, "objective": objective},
                      "out_dir": str(root / name)}).run_dir

    return {"sas": run("sas", "sas"), "pre-ln": run("pre-ln", "pre-ln"), "short": run("short", "pre-ln", 16),
            "mlm": run("mlm", "pre-ln", objective="mlm")}


def _raw_windows(run_dir, **kwargs):
    """The held-out windows, built here from the run's prepared split (not through diagnose_run)."""
    from blocklab.analysis import held_out_windows
    from blocklab.data import prepare_data
    from blocklab.training import load_run

    run = load_run(run_dir)
    data = prepare_data(run.config.data)
    return run, data, held_out_windows(data.split("val"), run.config.seq_len, eos_id=data.tokenizer.eos_id,
                                       **kwargs)


def test_diagnose_run_is_diagnose_on_the_run_s_held_out_windows(runs, tmp_path):
    from blocklab.analysis import diagnose_run

    results = diagnose_run(runs["sas"], tmp_path / "out", batches=1, map_tokens=8, start="separator")
    run, data, windows = _raw_windows(runs["sas"], batch_size=8, max_batches=1, start="separator")
    assert (windows[0][:, 0] == data.tokenizer.eos_id).all()  # the same start token in every sequence
    expected = diagnose(run.model, windows, max_batches=1, map_tokens=8)
    assert results["entropy"] == expected["entropy"] and results["similarity"] == expected["similarity"]
    assert results["meta"]["start"] == "separator" and results["meta"]["sequences"] == windows[0].shape[0]
    assert json.loads((tmp_path / "out" / "diagnostics.json").read_text()) == results
    assert (tmp_path / "out" / "scalars.png").is_file()  # SAS logs its gains


def test_masked_lm_runs_are_diagnosed_on_unmasked_windows(runs):
    from blocklab.analysis import diagnose_run

    results = diagnose_run(runs["mlm"], batches=1)
    run, data, windows = _raw_windows(runs["mlm"], batch_size=8, max_batches=1)
    assert not run.model.cfg.causal and results["meta"]["objective"] == "mlm"
    assert not (windows[0] == data.tokenizer.mask_id).any()
    np.testing.assert_array_equal(windows[0][0].numpy(), data.split("val")[:32])  # the raw stream
    assert results["entropy"] == diagnose(run.model, windows, max_batches=1)["entropy"]
    # a window as the masked-LM batches give it would differ: the mask token is in it
    from blocklab.data import Batches

    masked = next(Batches(data, "val", 8, 32).validation(8, 1))["input_ids"]
    assert (masked == data.tokenizer.mask_id).any()


def test_cli_diagnose_writes_valid_files_and_refuses_different_lengths(runs, tmp_path, capsys):
    from blocklab.cli import main

    out = tmp_path / "sas"
    assert main(["diagnose", "--run", str(runs["sas"]), "--out", str(out), "--batches", "1",
                 "--map-tokens", "8", "--layers", "1", "--start", "document"]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["attention_matrix.png", "attention_softmax.png", "entropy.png", "first_token.png",
                    "positions.png", "scalars.png", "similarity.png", "spectrum.png"]
    for name in pngs:
        _check_png(out / name)
    results = json.loads((out / "diagnostics.json").read_text())
    assert {"meta", "entropy", "importance", "value_norm", "hidden_norm", "similarity", "spectrum",
            "attention_maps", "notes"} <= set(results)
    assert set(results["importance"]["uniform_attention"]) == {"first_token", "other_tokens"}
    maps = results["attention_maps"]
    assert {(m["layer"], m["kind"], m["size"]) for m in maps} == {(1, "softmax", 8), (1, "matrix", 8)}
    assert np.asarray(maps[0]["values"]).shape == (8, 8)
    assert results["meta"]["start"] == "document"

    cmp = tmp_path / "cmp"
    assert main(["diagnose", "--compare", str(runs["sas"]), str(runs["pre-ln"]), "--out", str(cmp),
                 "--batches", "1"]) == 0
    _check_png(cmp / "compare.png")
    assert json.loads((cmp / "compare.json").read_text())["labels"] == ["sas", "pre-ln"]

    assert main(["diagnose", "--compare", str(runs["pre-ln"]), str(runs["short"]), "--batches", "1"]) == 2
    assert "same seq_len" in capsys.readouterr().err
    with pytest.raises(ValueError, match="different sequence lengths"):
        a = diagnose(make_model("pre-ln"), [tokens(t=8)])
        compare_reports(a, diagnose(make_model("pre-ln"), [tokens(t=6)]), tmp_path / "x")
