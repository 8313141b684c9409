"""The benchmark scripts run: bench_gpu.py's CPU smoke mode end to end with the hand-written GPT-2
contender, bench_train.py's contenders compute one function, and bench_decode.py's hand-written decoding
loop gives the tokens of `LanguageModel.generate` on the same weights."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blocklab

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))  # the scripts import their neighbours (_measure, bench_decode)

import bench_decode  # noqa: E402
import bench_gpu  # noqa: E402
import bench_prepare  # noqa: E402
from timeouts import patient  # noqa: E402


def perturbed(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every parameter moved from its init: zero biases and unit LayerNorm gains would hide a bug."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


@pytest.mark.slow  # 20-35 s of compiling or a subprocess: CI's slow tier runs it
def test_bench_gpu_cpu_smoke_prints_the_table_and_writes_the_json(tmp_path):
    out = tmp_path / "gpu-smoke.json"
    cmd = [sys.executable, str(BENCH / "bench_gpu.py"), "--device", "cpu", "--smoke", "--archs", "pre-ln,bov",
           "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=patient(120), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    header = "| arch | mode | batch | params | tokens/s (min-max) | x hand, same mode | step ms |"
    assert header in run.stdout
    assert "| hand | eager | 2 |" in run.stdout and "| pre-ln | eager | 2 |" in run.stdout
    assert "| bov | eager | 2 |" in run.stdout
    result = json.loads(out.read_text())
    assert result["smoke"] is True and result["table"] in run.stdout
    peaks = result["peaks"]
    assert peaks["measured_tflops"] > 0 and peaks["datasheet_tflops"] is None  # a CPU has no table entry
    assert [r["arch"] for r in result["rows"]] == ["hand", "pre-ln", "bov"]  # the hand model first
    rows = {r["arch"]: r for r in result["rows"]}
    assert all(r["mode"] == "eager" for r in rows.values())
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and len(r["runs"]) == 1 and r["batch"] == 2 and r["seq_len"] == 32
        assert r["flops_per_token"] > 0 and 0 < r["mfu_measured"] and r["mfu_datasheet"] is None
        assert r["peak_memory_gib"] is None  # CUDA only
    hand_row = rows["hand"]
    assert hand_row["params"] == rows["pre-ln"]["params"]  # the same shape, tied head
    assert hand_row["flops_per_token"] == rows["pre-ln"]["flops_per_token"]
    assert hand_row["loss"] == "F.cross_entropy(logits.float())" and "decode" not in hand_row
    assert hand_row["vs_hand"] == 1.0
    for arch in ("pre-ln", "bov"):
        r = rows[arch]
        assert r["vs_hand"] == pytest.approx(r["tokens_per_s"] / hand_row["tokens_per_s"])
        assert r["loss"] == "lm_loss"  # the trainer's loss
        assert set(r["decode"]) == {"1", "2"} and r["decode"]["1"]["blocklab_tokens_per_s"] > 0
    hand = rows["pre-ln"]["decode"]["1"]  # the hand-written loop covers plain pre-ln only
    assert hand["same_tokens"] is True and hand["hand_tokens_per_s"] > 0
    assert hand["compiled_same_tokens"] is True and hand["compiled_tokens_per_s"] > 0  # compile_decoding
    assert "compiled_tokens_per_s" not in rows["bov"]["decode"]["1"]
    assert "hand_tokens_per_s" not in rows["bov"]["decode"]["1"]
    assert not (BENCH / "results" / "bench_gpu-smoke.json").exists()


@pytest.mark.slow  # in CI's slow tier: the default suite keeps to about 10 minutes
def test_bench_gpu_compares_each_mode_with_the_hand_model_in_its_mode(tmp_path):
    """Every compiled mode is compared with the hand model under torch.compile, eager with eager, per batch;
    dynamo's eager backend keeps it fast (the same code paths as inductor, without code generation)."""
    result = bench_gpu.main(["--device", "cpu", "--smoke", "--archs", "pre-ln", "--modes",
                             "eager,compile,compile-blocks,compile-model", "--compile-backend", "eager",
                             "--decode-batches", "none", "--batch", "2,3", "--vocab", "300",
                             "--out", str(tmp_path / "modes.json")])
    rows = result["rows"]
    assert [(r["batch"], r["arch"], r["mode"]) for r in rows] == [
        (b, arch, mode) for b in (2, 3) for arch, mode in [
            ("hand", "eager"), ("pre-ln", "eager"), ("hand", "compiled"), ("pre-ln", "compile"),
            ("pre-ln", "compile-blocks"), ("pre-ln", "compile-model")]]
    assert all("skipped" not in r for r in rows) and result["dims"]["vocab_size"] == 300
    hand = {(r["batch"], r["mode"]): r["tokens_per_s"] for r in rows if r["arch"] == "hand"}
    for r in rows:
        if r["arch"] != "hand":
            ref = hand[(r["batch"], "eager" if r["mode"] == "eager" else "compiled")]
            assert r["vs_hand"] == pytest.approx(r["tokens_per_s"] / ref)
    how = {(r["arch"], r["mode"]): (r["compiled"], r["loss"]) for r in rows if r["batch"] == 2}
    assert how[("hand", "compiled")] == ("torch.compile(model)", "F.cross_entropy(logits.float())")
    assert how[("pre-ln", "compile-model")] == ("torch.compile(model)", "F.cross_entropy(logits.float())")
    assert how[("pre-ln", "compile-blocks")] == ("compile_blocks()", "lm_loss")
    expected = "compile_model()" if hasattr(blocklab.LanguageModel, "compile_model") else "compile_blocks()"
    assert how[("pre-ln", "compile")][0].startswith(expected) and how[("pre-ln", "compile")][1] == "lm_loss"


@pytest.mark.slow  # 20-35 s of compiling or a subprocess: CI's slow tier runs it
def test_bench_gpu_smoke_decodes_with_frozen_weights(tmp_path):
    """`--decode-freeze`: the compiled decoding copy runs `compile_decoding(freeze_weights=True)` end to
    end (inductor on this CPU) and gives eager decoding's tokens."""
    out = tmp_path / "gpu-frozen.json"
    cmd = [sys.executable, str(BENCH / "bench_gpu.py"), "--device", "cpu", "--smoke", "--archs", "pre-ln",
           "--decode-batches", "1", "--decode-freeze", "--hand", "none", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=patient(300), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["options"]["decode_freeze"] is True
    (row,) = result["rows"]  # --hand none: blocklab's row alone
    decoded = row["decode"]["1"]
    assert decoded["compiled_same_tokens"] is True and decoded["compiled_tokens_per_s"] > 0


@pytest.mark.parametrize("name, entry", [("NVIDIA H100 80GB HBM3", ("H100", 989.0)),
                                         ("NVIDIA H100 PCIe", ("H100 PCIe", 756.0)),
                                         ("NVIDIA H200", ("H200", 989.0)),
                                         ("NVIDIA A100-SXM4-80GB", ("A100", 312.0)),
                                         ("NVIDIA GeForce RTX 4090", None)])
def test_datasheet_peak_by_device_name(name, entry):
    assert bench_gpu.datasheet_peak(name) == entry


def test_bench_gpu_budget_skips_configurations(tmp_path):
    out = tmp_path / "skipped.json"
    result = bench_gpu.main(["--device", "cpu", "--smoke", "--archs", "pre-ln,sas", "--budget-s", "0",
                             "--out", str(out)])
    assert [r["arch"] for r in result["rows"]] == ["hand", "pre-ln", "sas"]
    assert [r["skipped"].startswith("time budget") for r in result["rows"]] == [True, True, True]
    assert json.loads(out.read_text())["rows"] == result["rows"]


def test_bench_gpu_budget_counts_from_the_call_not_the_import(tmp_path, monkeypatch):
    """A main() called long after the module was imported (a test session, a campaign) still has its
    budget: 1,000 s "pass" between the import and the call."""
    import time

    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + 1000.0)
    result = bench_gpu.main(["--device", "cpu", "--smoke", "--archs", "pre-ln", "--modes", "eager",
                             "--decode-batches", "none", "--budget-s", "300", "--out", str(tmp_path / "o")])
    assert [r["arch"] for r in result["rows"]] == ["hand", "pre-ln"]
    assert all("skipped" not in r for r in result["rows"])


def test_bench_gpu_refuses_bad_batches_and_vocabularies():
    for bad in (["--batch", "8,x"], ["--batch", "0"], ["--vocab", "1"], ["--hand", "always"]):
        with pytest.raises(SystemExit):
            bench_gpu.parse_args(["--device", "cpu", *bad])


def test_hand_gpt_computes_the_logits_of_hf_gpt2_and_blocklab_pre_ln():
    """bench_train's equivalence check for the hand-written contender, in float64 on perturbed weights:
    HF's GPT2LMHeadModel loaded with `hand_gpt.hf_state_dict` and blocklab's pre-ln built from that HF
    model (`blocklab.interop.from_hf`, the GPT2Config's shape) give the hand model's logits."""
    pytest.importorskip("transformers")
    import bench_train

    shape = dict(n_layer=2, n_embd=48, n_head=3, n_positions=24, vocab_size=97)
    torch.manual_seed(0)
    hand = perturbed(bench_train.make_hand(shape)).double()
    ours = bench_train.blocklab_from_hand(hand, shape)
    assert isinstance(ours, blocklab.LanguageModel)
    assert ours.cfg.n_heads == 3 and ours.cfg.mlp_act == "gelu_tanh"
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hand.parameters())
    ids = torch.randint(0, 97, (3, 24))
    with torch.no_grad():
        expected = hand(ids)
        assert expected.shape == (3, 24, 97) and expected.dtype == torch.float64
        torch.testing.assert_close(ours(ids), expected, rtol=0, atol=1e-10)
    # a blocklab model whose weights were not copied differs: the check can fail
    other = blocklab.LanguageModel(ours.cfg).double()
    with torch.no_grad():
        assert (other(ids) - expected).abs().max() > 1e-3


def test_hand_gpt_init_is_gpt2s():
    """N(0, 0.02) weights, N(0, 0.02 / sqrt(2 L)) residual projections, zero biases, the head tied."""
    from hand_gpt import HandGPT

    torch.manual_seed(0)
    model = HandGPT(vocab_size=1000, d_model=128, n_layers=8, n_heads=4, context_length=64)
    block = model.blocks[3]
    assert block.c_attn.weight.shape == (3 * 128, 128) and block.c_fc.weight.shape == (512, 128)
    assert block.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    assert block.c_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    assert not block.c_fc.bias.any() and torch.equal(block.ln_1.weight, torch.ones(128))
    per_block = 12 * 128**2 + 13 * 128  # QKV, output, MLP in and out (weights and biases), two norms
    assert sum(p.numel() for p in model.parameters()) == (1000 + 64) * 128 + 8 * per_block + 2 * 128


def test_bench_train_sas_p_is_the_preset_at_the_gpt2_shape():
    """The sas-p contender: the GPT-2 config with SAS-P's block fields on top; fewer FLOPs per token."""
    pytest.importorskip("transformers")
    import bench_train
    from blocklab.model.presets import BLOCK_PRESETS

    shape = bench_train.SHAPES["small"]
    pre, sas = (bench_train.blocklab_config(k, shape) for k in ("blocklab", "blocklab-sas-p"))
    for field, value in BLOCK_PRESETS["sas-p"].fields.items():
        assert getattr(sas, field) == value, field
    for field in ("d_model", "n_layers", "n_heads", "mlp_hidden", "vocab_size", "context_length", "norm",
                  "positions", "mlp_act", "bias", "tie_embeddings"):
        assert getattr(sas, field) == getattr(pre, field), field
    assert pre.block_layout == "pre-ln" and pre.attn_matrix == "softmax"
    flops = {k: bench_train.model_flops(k, "small", 256) for k in ("hand", "blocklab", "blocklab-sas-p")}
    assert flops["hand"] == flops["blocklab"] > flops["blocklab-sas-p"]


def test_bench_train_reference_and_sas_p_summary():
    import bench_train

    opts = dict(eager=True, reference="auto")
    assert bench_train.contenders("small", opts) == (
        {"hand": "hand", "blocklab": "blocklab", "blocklab (control)": "blocklab",
         "blocklab sas-p": "blocklab-sas-p"}, "hand")
    labels, ref = bench_train.contenders("tiny", opts)
    assert ref == "HF sdpa" and "hand" in labels and "HF eager" in labels
    labels, ref = bench_train.contenders("d768x4", dict(opts, reference="hf-sdpa"))
    assert ref == "HF sdpa" and labels["HF sdpa"] == "hf-sdpa"
    rows = [dict(size="small", label="blocklab", runs=[100.0, 80.0, 90.0], tokens_per_s=90.0,
                 flops_per_token=120, params=dict(total=10)),
            dict(size="small", label="blocklab sas-p", runs=[110.0, 100.0, 90.0], tokens_per_s=100.0,
                 flops_per_token=100, params=dict(total=9))]
    summary = bench_train.sas_p_summary(rows)
    assert summary["speed"] == pytest.approx(100 / 90)
    assert summary["inverse_flops_ratio"] == pytest.approx(1.2)
    assert summary["speed_paired"] == pytest.approx(1.1)  # the median of 1.1, 1.25, 1.0
    assert bench_train.sas_p_summary(rows[:1]) is None


@pytest.mark.slow
def test_bench_train_quick_run_measures_the_hand_model(tmp_path):
    """bench_train.py --sizes small --quick: the four children (hand, blocklab, its control, sas-p) run
    side by side, the hand model is the reference and SAS-P's ratio sits beside its inverse FLOPs ratio."""
    pytest.importorskip("transformers")
    import bench_train

    out = tmp_path / "train.json"
    result = bench_train.main(["--sizes", "small", "--quick", "--no-trainer", "--peak-tflops", "1",
                               "--out", str(out)])
    saved = json.loads(out.read_text())["rows"]
    assert [(r["label"], r["tokens_per_s"]) for r in saved] == [
        (r["label"], r["tokens_per_s"]) for r in result["rows"]]
    rows = {r["label"]: r for r in result["rows"]}
    assert set(rows) == {"hand", "blocklab", "blocklab (control)", "blocklab sas-p"}
    assert rows["hand"]["vs_reference"] == 1.0 and all(r["reference"] == "hand" for r in rows.values())
    assert rows["blocklab"]["params"] == rows["hand"]["params"]
    assert result["same_model_check"]["small"]["hand"]["max_abs_logit_diff"] < 1e-4
    (summary,) = result["sas_p_vs_pre_ln"]
    assert summary["size"] == "small" and summary["inverse_flops_ratio"] > 1


@pytest.mark.parametrize("batch", [1, 3])
def test_hand_loop_gives_the_tokens_of_generate(batch):
    model = perturbed(bench_decode.make_model("tiny", 40))
    hand = bench_decode.HandDecoder(model)
    prompt = torch.randint(0, 512, (batch, 7), generator=torch.Generator().manual_seed(batch))
    ours = model.generate(prompt, 20)
    assert ours.shape == (batch, 27)
    assert torch.equal(hand.generate(prompt, 20), ours)
    bench_decode.check_same_tokens(model, hand, prompt, 20)


@pytest.mark.slow  # 20-35 s of compiling or a subprocess: CI's slow tier runs it
def test_frozen_hand_loop_gives_the_tokens_of_generate():
    """`--compile hand-frozen`: the hand loop's step compiled with the weights folded in."""
    model = perturbed(bench_decode.make_model("tiny", 40))
    frozen = bench_decode.FrozenHandDecoder(model)
    prompt = torch.randint(0, 512, (2, 7), generator=torch.Generator().manual_seed(5))
    bench_decode.check_same_tokens(model, frozen, prompt, 8)


def test_hand_loop_decodes_from_a_filled_past_as_generate_does():
    """bench_cache's hand-loop contender: `HandDecoder.decode` over keys and values copied from a
    blocklab cache after a prefill gives the tokens `generate` gives from that cache."""
    model = perturbed(bench_decode.make_model("tiny", 40))
    hand = bench_decode.HandDecoder(model)
    prompt = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(5))
    cache = model.new_cache(2, 30)
    with torch.no_grad():
        first = model(prompt, cache=cache)[:, -1].argmax(-1)
    keys, values = hand.new_cache(2, 30)
    heads, d = model.cfg.n_heads, model.cfg.attention_shape.head_dim
    for j in range(model.cfg.n_layers):
        keys[j, :, :, :9] = cache.keys[j].data[:, :9].transpose(1, 2)
        values[j, :, :, :9] = cache.values[j].data[:, :9].view(2, 9, heads, d).transpose(1, 2)
    ours = model.generate(first[:, None], 12, cache=cache)[:, 1:]
    assert torch.equal(hand.decode(first, keys, values, 9, 12), ours)


def test_hand_loop_refuses_what_it_does_not_compute():
    for arch in ("sas", "pre-ln+resformer"):
        cfg = blocklab.ModelConfig.from_preset(arch, "small", **bench_decode.SIZES["tiny"],
                                               **bench_decode.GPT2_BLOCK, context_length=32)
        with pytest.raises(ValueError, match="hand loop"):
            bench_decode.HandDecoder(blocklab.LanguageModel(cfg))


def test_bench_decode_main_measures_both_contenders(tmp_path):
    out = tmp_path / "decode.json"
    result = bench_decode.main(["--sizes", "tiny", "--batches", "1,2", "--prompt", "8", "--new", "6",
                                "--repeats", "3", "--out", str(out)])
    cells = json.loads(out.read_text())["cells"]
    assert [(c["size"], c["batch"]) for c in cells] == [("tiny", 1), ("tiny", 2)]
    for c in result["cells"]:
        assert [len(c["tokens_per_s"][name]) for name in (bench_decode.OURS, bench_decode.HAND)] == [3, 3]
        paired = c["summary"]["ratio_paired"]
        assert c["summary"]["ratio"] > 0 and paired["min"] <= paired["median"] <= paired["max"]
    assert "| tiny | 1 |" in result["table"]


def test_bench_decode_compiled_step_contender(tmp_path):
    """`--compile step-eager`: the whole decoding step captured as one graph gives generate's tokens
    (checked inside `main`) and is timed beside the others."""
    args = ["--sizes", "tiny", "--batches", "2", "--prompt", "8", "--new", "6", "--repeats", "2"]
    result = bench_decode.main([*args, "--compile", "step-eager", "--out", str(tmp_path / "d.json")])
    (cell,) = result["cells"]
    name = bench_decode.COMPILE_MODES["step-eager"]
    assert len(cell["tokens_per_s"][name]) == 2
    assert set(cell["summary"]["ratios_to_hand"]) == {name}
    assert name in result["table"]


@pytest.mark.parametrize(("mode", "frozen", "backend"), [("step", False, None), ("step-frozen", True, None),
                                                         ("step-eager", False, "eager")])
def test_bench_decode_compile_modes_configure_the_step(mode, frozen, backend):
    model = bench_decode.compiled_contender(mode, "tiny", 16, torch.device("cpu"))
    step = model._decoding
    assert step is not None and step.freeze_weights is frozen
    assert step.compile_kwargs.get("backend") == backend


def test_bench_decode_hand_frozen_mode_is_the_frozen_hand_loop():
    contender = bench_decode.compiled_contender("hand-frozen", "tiny", 16, torch.device("cpu"))
    assert isinstance(contender, bench_decode.FrozenHandDecoder)


def test_bench_decode_refuses_an_unknown_compile_mode():
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--compile", "graphs"])


@pytest.mark.slow  # about 15 s; the default suite runs the gpu-mid pieces' own smoke (test_gpu_campaign.py)
def test_gpu_campaign_cpu_smoke_runs_every_piece(tmp_path):
    """benchmarks/gpu_campaign.py all --smoke: the MFU table and both GPU claims' pieces at a toy size on
    the CPU; the runs keep their small files (no weights), each piece writes its report, and
    `blocklab reproduce --no-train` reads the same runs back to the same verdicts."""
    import gpu_campaign
    from blocklab.reproduce import reproduce
    from blocklab.statistics.claims import select
    from tests.helpers import write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    lines = gpu_campaign.main(["all", "--smoke", "--device", "cpu", "--out", str(out), "--data", str(corpus)])
    assert lines[0] == f"mfu: {out / 'gpu-smoke.json'}"
    assert json.loads((out / "gpu-smoke.json").read_text())["rows"]
    assert [line.rsplit(": ", 1)[0] for line in lines[1:]] == [
        "gpu-resformer-short: resformer-beats-pre-ln", "gpu-sas-p-short: sas-matches-pre-ln",
        "gpu-sas-p-short: sas-p-throughput"]
    for name, claims in gpu_campaign.PIECES.values():
        assert (out / name / "reproduction.md").is_file()
        assert not list((out / name).rglob("checkpoints"))
        runs = list((out / name).rglob("summary.json"))
        assert len(runs) == 3 * len(select(claims)[0].archs)
    name, claims = gpu_campaign.PIECES["sas-p"]
    saved = json.loads((out / name / "reproduction.json").read_text())
    smoke = gpu_campaign.piece_scale(name, argparse.Namespace(smoke=True, data=corpus))  # what trained them
    again = reproduce(select(claims), smoke, out, train=False, name=name)
    assert [r.verdict for r in again.results] == [c["verdict"] for c in saved["claims"]]


def test_bench_centering_checks_every_variant_and_restores_shaped_attention(tmp_path):
    """Every C V and shaped-attention variant agrees with float64 (the script's own checks, read back
    from its JSON: outputs and gradients), the SAS-P step pair is timed and its ops counted, and
    `ops.shaped_attention` and the kernel choice are the library's again after."""
    import bench_centering
    from blocklab.model import ops
    from blocklab.runtime import kernels

    library, choice = ops.shaped_attention, kernels.KERNELS
    out = tmp_path / "centering.json"
    bench_centering.main(["--shape", "2,2,24,8", "--train-size", "tiny", "--train-batch", "2",
                          "--warmup", "0", "--repeats", "1", "--out", str(out)])
    assert ops.shaped_attention is library and kernels.KERNELS is choice
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    shaped = bench_centering.shaped_variants()
    assert set(rows) == {*bench_centering.VARIANTS, *shaped, "SAS-P step, before",
                         "SAS-P step, ops.shaped_attention"}
    for name in [*bench_centering.VARIANTS, *shaped]:
        assert rows[name]["rel_err"] < 1e-6 and rows[name]["median_ms"] > 0, name
    for name in shaped:
        assert max(rows[name]["grad_rel_err"].values()) < 1e-5, name
    for before, now in [("shaped, before", "shaped, ops"), ("mix, before", "mix, ops"),
                        ("SAS-P step, before", "SAS-P step, ops.shaped_attention")]:
        assert rows[now]["ops"]["forward"] < rows[before]["ops"]["forward"], now
        assert rows[now]["ops"]["backward"] < rows[before]["ops"]["backward"], now


@pytest.mark.slow  # in CI's slow tier: the default suite keeps to about 10 minutes
def test_bench_loss_smoke_agrees_with_the_reference(tmp_path):
    """The chunked loss and the float32-logits reference, timed and measured, agree (the script's own
    check of loss and gradients, read back from its JSON)."""
    out = tmp_path / "loss.json"
    done = subprocess.run([sys.executable, str(BENCH / "bench_loss.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=patient(300))
    assert done.returncode == 0, done.stderr
    assert "| chunked |" in done.stdout
    result = json.loads(out.read_text())
    assert result["smoke"] is True
    chunked = [r for r in result["rows"] if r["method"] == "chunked"]
    assert chunked
    for row in chunked:
        assert row["dx_rel"] < 1e-5 and row["dw_rel"] < 1e-5 and row["loss_diff"] < 1e-5, row


@pytest.mark.slow  # in CI's slow tier: the default suite keeps to about 10 minutes
def test_bench_fused_projections_quick_run_times_both_modes(tmp_path):
    out = tmp_path / "fused.json"
    done = subprocess.run([sys.executable, str(BENCH / "bench_fused_projections.py"), "--quick", "--shapes",
                           "small", "--out", str(out)], capture_output=True, text=True, timeout=patient(300))
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["speedup_paired"] > 0 and r["fused_ms"] > 0 for r in rows), rows


def test_bench_prepare_smoke_times_every_contender_on_the_same_tokens(tmp_path, capsys, monkeypatch):
    """bench_prepare.py: blocklab's data path and the tokenizers library alone (in one call and
    in batches) count the same tokens of the same corpus (the script stops if they do not); the table
    printed is the one written, its ratios the rounds' own."""
    monkeypatch.setattr(bench_prepare, "BATCH_CHARS", 50_000)  # several batches of the 0.3 MB corpus
    out = tmp_path / "prepare.json"
    result = bench_prepare.main(["--smoke", "--out", str(out)])
    rows = {r["contender"]: r for r in result["rows"]}
    assert list(rows) == list(bench_prepare.CONTENDERS) and len(rows) == 4
    ours = rows["blocklab"]
    assert ours["tokens"] > 10_000 and {r["tokens"] for r in rows.values()} == {ours["tokens"]}
    for r in rows.values():
        assert len(r["rounds"]) == 1 and r["tokens_per_s"] > 0
        assert r["this_over_blocklab"] == pytest.approx(r["rounds"][0]["s"] / ours["rounds"][0]["s"])
        assert r["best_over_blocklab_best"] == pytest.approx(r["this_over_blocklab"])  # one round
    assert json.loads(out.read_text())["table"] == result["table"]
    assert result["table"] in capsys.readouterr().out


@pytest.mark.slow  # about 15 s of compiling: CI's slow tier runs it
def test_compiled_shaped_check_judges_a_variant_against_float64(tmp_path):
    """benchmarks/compiled_shaped_check.py (prepared for a GPU call) on the CPU: the compiled model's
    gradients are as close to float64 as the eager model's, and the JSON names each variant."""
    import compiled_shaped_check

    out = tmp_path / "check.json"
    rows = compiled_shaped_check.main(["--device", "cpu", "--t", "24", "--archs", "sas-p",
                                       "--variants", "default,blocks", "--out", str(out)])
    assert [r["variant"] for r in rows] == ["default", "blocks"]
    assert all(r["ok"] and 0 < r["eager"] < 0.1 for r in rows), rows
    assert json.loads(out.read_text())["rows"][0]["worst"]
