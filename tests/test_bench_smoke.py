"""The benchmark scripts run: bench_gpu.py's CPU smoke mode end to end, and bench_decode.py's
hand-written decoding loop gives the tokens of `Transformer.generate` on the same weights."""

from __future__ import annotations

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


def perturbed(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every parameter moved from its init: zero biases and unit LayerNorm gains would hide a bug."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def test_bench_gpu_cpu_smoke_prints_the_table_and_writes_the_json(tmp_path):
    out = tmp_path / "gpu-smoke.json"
    cmd = [sys.executable, str(BENCH / "bench_gpu.py"), "--device", "cpu", "--smoke", "--archs", "pre-ln,bov",
           "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    header = "| arch | mode | params | tokens/s (min-max) | step ms |"
    assert header in run.stdout
    assert "| pre-ln | eager |" in run.stdout and "| bov | eager |" in run.stdout
    result = json.loads(out.read_text())
    assert result["smoke"] is True and result["table"] in run.stdout
    peaks = result["peaks"]
    assert peaks["measured_tflops"] > 0 and peaks["datasheet_tflops"] is None  # a CPU has no table entry
    rows = {r["arch"]: r for r in result["rows"]}
    assert set(rows) == {"pre-ln", "bov"} and all(r["mode"] == "eager" for r in rows.values())
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and len(r["runs"]) == 1 and r["batch"] == 2 and r["seq_len"] == 32
        assert r["flops_per_token"] > 0 and 0 < r["mfu_measured"] and r["mfu_datasheet"] is None
        assert r["peak_memory_gib"] is None  # CUDA only
        assert set(r["decode"]) == {"1", "2"} and r["decode"]["1"]["blocklab_tokens_per_s"] > 0
    hand = rows["pre-ln"]["decode"]["1"]  # the hand-written loop covers plain pre-ln only
    assert hand["same_tokens"] is True and hand["hand_tokens_per_s"] > 0
    assert hand["compiled_same_tokens"] is True and hand["compiled_tokens_per_s"] > 0  # compile_decoding
    assert "compiled_tokens_per_s" not in rows["bov"]["decode"]["1"]
    assert "hand_tokens_per_s" not in rows["bov"]["decode"]["1"]
    assert not (BENCH / "results" / "bench_gpu-smoke.json").exists()


def test_bench_gpu_smoke_decodes_with_frozen_weights(tmp_path):
    """`--decode-freeze`: the compiled decoding copy runs `compile_decoding(freeze_weights=True)` end to
    end (inductor on this CPU) and gives eager decoding's tokens."""
    out = tmp_path / "gpu-frozen.json"
    cmd = [sys.executable, str(BENCH / "bench_gpu.py"), "--device", "cpu", "--smoke", "--archs", "pre-ln",
           "--decode-batches", "1", "--decode-freeze", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["options"]["decode_freeze"] is True
    (row,) = result["rows"]
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
    assert [r["skipped"].startswith("time budget") for r in result["rows"]] == [True, True]
    assert json.loads(out.read_text())["rows"] == result["rows"]


@pytest.mark.parametrize("batch", [1, 3])
def test_hand_loop_gives_the_tokens_of_generate(batch):
    model = perturbed(bench_decode.make_model("tiny", 40))
    hand = bench_decode.HandDecoder(model)
    prompt = torch.randint(0, 512, (batch, 7), generator=torch.Generator().manual_seed(batch))
    ours = model.generate(prompt, 20)
    assert ours.shape == (batch, 27)
    assert torch.equal(hand.generate(prompt, 20), ours)
    bench_decode.check_same_tokens(model, hand, prompt, 20)


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
            bench_decode.HandDecoder(blocklab.Transformer(cfg))


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


def test_gpu_campaign_cpu_smoke_runs_every_piece(tmp_path):
    """benchmarks/gpu_campaign.py all --smoke: the MFU table and both GPU claims' pieces at a toy size on
    the CPU; the runs keep their small files (no weights), each piece writes its report, and
    `blocklab reproduce --no-train` reads the same runs back to the same verdicts."""
    from tests.helpers import write_code_corpus

    import gpu_campaign
    from blocklab.claims import select
    from blocklab.reproduce import reproduce

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
    again = reproduce(select(claims), name, out, train=False)
    assert [r.verdict for r in again.results] == [c["verdict"] for c in saved["claims"]]


def test_bench_centering_checks_every_variant_and_restores_masked_mean(tmp_path):
    """Every C V variant agrees with the float64 running mean (the script's own check, read back from
    its JSON), the SAS-P step pair is timed, and `ops.masked_mean` is the library's again after."""
    import bench_centering
    from blocklab import ops

    library = ops.masked_mean
    out = tmp_path / "centering.json"
    bench_centering.main(["--shape", "2,2,24,8", "--train-size", "tiny", "--train-batch", "2",
                          "--warmup", "0", "--repeats", "1", "--out", str(out)])
    assert ops.masked_mean is library
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {*bench_centering.VARIANTS, "SAS-P step, before", "SAS-P step, ops.masked_mean"}
    for name in bench_centering.VARIANTS:
        assert rows[name]["rel_err"] < 1e-6 and rows[name]["median_ms"] > 0, name
