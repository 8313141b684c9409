"""The `blocklab` command line."""

from __future__ import annotations

import re

import pytest
import torch

from blocklab import LanguageModel, ModelConfig, count_parameters
from blocklab.cli import main
from blocklab.model.presets import BLOCK_PRESETS, SIZE_PRESETS


def total_params(arch, size):
    with torch.device("meta"):
        return count_parameters(LanguageModel(ModelConfig.from_preset(arch, size))).total


def row_of(out, arch, size):
    rows = [line.split() for line in out.splitlines() if line.split()[:2] == [arch, size]]
    assert len(rows) == 1, out
    return rows[0]


def test_params_prints_the_counts(capsys):
    assert main(["params", "--arch", "sas", "--size", "codeparrot-18l"]) == 0
    out = capsys.readouterr().out
    row = row_of(out, "sas", "codeparrot-18l")
    total = float(row[2].rstrip("M")) * 1e6
    assert total == pytest.approx(total_params("sas", "codeparrot-18l"), abs=0.006e6)
    assert total == pytest.approx(146e6, rel=0.01)  # Simplifying Sec. 4.2


def test_params_several_archs_and_sizes(capsys):
    assert main(["params", "--arch", "pre-ln,sas-p", "--size", "tiny,codeparrot-18l"]) == 0
    out = capsys.readouterr().out
    for arch in ("pre-ln", "sas-p"):
        for size in ("tiny", "codeparrot-18l"):
            row = row_of(out, arch, size)
            assert float(row[2].rstrip("M")) * 1e6 == pytest.approx(total_params(arch, size), abs=0.006e6)
    pre = float(row_of(out, "pre-ln", "codeparrot-18l")[2].rstrip("M"))
    assert pre == pytest.approx(167, rel=0.01)


def test_params_all_lists_every_block_preset(capsys):
    assert main(["params", "--all", "--size", "tiny"]) == 0
    out = capsys.readouterr().out
    for arch in BLOCK_PRESETS:
        row_of(out, arch, "tiny")


def test_presets_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    names = set(re.findall(r"^\s+(\S+)\s", out, flags=re.MULTILINE))
    assert set(BLOCK_PRESETS) <= names
    assert set(SIZE_PRESETS) <= names


@pytest.mark.parametrize("argv,name", [
    (["params", "--arch", "nope"], "nope"),
    (["params", "--arch", "sas,bogus-arch"], "bogus-arch"),
    (["params", "--arch", "sas", "--size", "enormous"], "enormous"),
])
def test_bad_preset_returns_2_with_a_clear_message(argv, name, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert name in captured.err
    assert "error" in captured.err.lower()
    assert "Known" in captured.err or "known" in captured.err
    assert "Traceback" not in captured.err


# -- blocklab generate on a trained run ------------------------------------------------------------------
def test_generate_continues_a_prompt_greedily_as_full_forward_passes_do(tmp_path, capsys):
    from blocklab.training import TrainConfig, load_run, train

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"f{i}.py").write_text("def f(x):\n    return x + 1\n" * (20 + i))
    cfg = TrainConfig.from_dict(dict(
        arch="sas-p+svformer", size="tiny", model={"d_model": 32, "n_layers": 2, "n_heads": 2}, batch_size=4,
        seq_len=32, max_steps=15, eval_every=0, ckpt_every=0, progress=False, out_dir=str(tmp_path / "run"),
        optim={"lr": 3e-3, "warmup_fraction": 0.0},
        data={"source": str(corpus), "tokenizer": "byte", "cache_dir": str(tmp_path / "cache"),
              "val_fraction": 0.2}))
    train(cfg)
    run = load_run(tmp_path / "run")
    prompt = "def f(x):\n"

    # reference: argmax of a full forward pass over the whole sequence, no cache, one token at a time
    ids = run.tokenizer.encode(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(run.model(torch.tensor([ids]))[0, -1].argmax()))
    expected = prompt + run.tokenizer.decode(ids[len(run.tokenizer.encode(prompt)):])

    assert main(["generate", "--run", str(tmp_path / "run"), "--prompt", prompt, "--max-new-tokens", "12",
                 "--no-stop"]) == 0
    assert capsys.readouterr().out == expected + "\n"

    # sampling with a seed repeats itself; a bad setting is a clear error, not a traceback
    args = ["generate", "--run", str(tmp_path / "run"), "--prompt", prompt, "--temperature", "1.0",
            "--top-k", "5", "--seed", "3", "--max-new-tokens", "8"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert main(["generate", "--run", str(tmp_path / "run"), "--prompt", prompt, "--top-p", "1.5"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert main(["generate", "--run", str(tmp_path / "nowhere"), "--prompt", prompt]) == 2
    assert "not a blocklab run directory" in capsys.readouterr().err


# -- blocklab params for the value paths -------------------------------------------------------------------
def millions(cell: str) -> float:
    return float(cell.rstrip("M")) * 1e6


def test_params_bov_columns_equal_a_hand_count(capsys):
    """tiny: vocab 4096, d 128, 4 layers, ReLU MLP 512, RMSNorm (no bias), tied, sinusoidal (no
    position parameters); BoV targets layers >= floor(2 * 4 / 3) = 2, i.e. layers 2 and 3."""
    tiny = SIZE_PRESETS["tiny"].fields
    vocab, d, n_layers, hidden = 4096, 128, 4, 512
    assert (tiny["vocab_size"], tiny["d_model"], tiny["n_layers"], tiny["mlp_hidden"]) == (vocab, d, n_layers,
                                                                                           hidden)
    assert main(["params", "--arch", "pre-ln,pre-ln+bov", "--size", "tiny"]) == 0
    out = capsys.readouterr().out
    layer = 4 * d * d + 2 * d * hidden + 2 * d  # W_Q, W_K, W_V, W_O, the MLP and two RMSNorm weights
    targets = 2
    expected = {  # arch: (total, embedding, value tables, non-embedding)
        "pre-ln": (vocab * d + n_layers * layer + d, vocab * d, 0, n_layers * layer + d),
        # each target layer drops W_V (d x d), gains gamma_v and a table (vocab x d)
        "pre-ln+bov": (vocab * d + targets * vocab * d + n_layers * layer + d - targets * (d * d - 1),
                       vocab * d, targets * vocab * d, n_layers * layer + d - targets * (d * d - 1)),
    }
    for arch, counts in expected.items():
        row = row_of(out, arch, "tiny")
        for cell, count in zip(row[2:6], counts, strict=True):
            assert millions(cell) == pytest.approx(count, abs=0.005e6), (arch, row)
    bov, base = row_of(out, "pre-ln+bov", "tiny"), row_of(out, "pre-ln", "tiny")
    assert millions(bov[6]) < millions(base[6])  # FLOPs per token: the lookup replaces a matmul


def test_params_all_lists_every_value_path(capsys):
    from blocklab.model.value_paths import VALUE_PATHS

    assert main(["params", "--all", "--size", "tiny"]) == 0
    out = capsys.readouterr().out
    for vp in VALUE_PATHS:  # "standard" is the bare block preset
        row_of(out, "pre-ln" if vp == "standard" else f"pre-ln+{vp}", "tiny")
