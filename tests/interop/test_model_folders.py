"""A blocklab export used like a run: `blocklab generate`, `eval` and `finetune` on a Hugging Face GPT-2
imported with `blocklab import-hf`, and `python -m blocklab`.

References: the HF `transformers` model the import was made from (its greedy `generate`, its logits
read by hand), perturbed away from its initialisation so that a dropped or transposed weight shows.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

from blocklab.cli import main  # noqa: E402
from blocklab.interop import load_pretrained, save_pretrained  # noqa: E402
from blocklab.training.runs import load_model_folder  # noqa: E402
from tests.interop.test_import_hf import (  # noqa: E402
    SPECIALS,
    VOCAB,
    assert_same_logits,
    hf_model,
    word_tokenizer,
)
from timeouts import patient  # noqa: E402

PROMPT = "w3 w14 w1"


def sentencepiece_like(specials: list[str]):
    """A word tokenizer in the manner of Llama's sentencepiece one: every word carries the "▁" of the
    space before it, and decoding drops the space that begins a text."""
    words = specials + [f"\u2581w{i}" for i in range(VOCAB - len(specials))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = decoders.Metaspace(prepend_scheme="always")
    return tok


def import_tiny(kind: str, root, seed: int):
    """A tiny perturbed HF model of `kind` saved with its tokenizer (GPT-2: words joined by spaces;
    Llama: sentencepiece-like), imported with `blocklab import-hf` into root/imported."""
    hf = hf_model(kind, seed=seed).eval()
    hf.save_pretrained(root / "hf")
    tok = word_tokenizer(SPECIALS[kind]) if kind == "gpt2" else sentencepiece_like(SPECIALS[kind])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                eos_token=SPECIALS[kind][0] if kind == "gpt2" else "</s>")
    fast.save_pretrained(root / "hf")
    assert main(["import-hf", str(root / "hf"), "--out", str(root / "imported")]) == 0
    return hf, root / "imported"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(a tiny HF GPT-2, the blocklab export `blocklab import-hf` made of it). Seed 1: its greedy
    continuation of PROMPT varies (seed 0's repeats one token)."""
    return import_tiny("gpt2", tmp_path_factory.mktemp("import"), seed=1)


def word_id(word: str, kind: str = "gpt2") -> int:
    """The id of "wN" in the tiny tokenizers: after their special tokens."""
    return len(SPECIALS[kind]) + int(word[1:])


def test_the_export_loads_as_a_run_would(imported):
    hf, folder = imported
    run = load_model_folder(folder)
    assert run.config is None and run.checkpoint == folder / "model.safetensors" and not run.model.training
    assert run.tokenizer.eos_token == "<|endoftext|>" and run.tokenizer.eos_id == 0
    assert run.tokenizer.encode(PROMPT) == [word_id(w) for w in PROMPT.split()]
    assert_same_logits(run.model, hf)


def _hf_greedy(hf, kind: str, n: int) -> list[str]:
    """The words HF's greedy generate continues PROMPT with (none of them a special token)."""
    ids = torch.tensor([[word_id(w, kind) for w in PROMPT.split()]])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                          pad_token_id=0)
    new = out[0, ids.shape[1]:].tolist()
    specials = len(SPECIALS[kind])
    assert len(new) == n and min(new) >= specials and len(set(new)) > 3  # varied: the test has teeth
    return [f"w{i - specials}" for i in new]


@pytest.mark.parametrize("kind, seed", [("gpt2", 1), ("llama", 0)])
def test_generate_on_an_import_follows_hf_greedy_decoding(kind, seed, imported, tmp_path, capsys):
    """The printed text is the prompt and then HF's greedy words, a space before each: the Llama-like
    decoder, which drops the space that begins a text, must not glue the first word to the prompt."""
    hf, folder = imported if kind == "gpt2" else import_tiny(kind, tmp_path, seed)
    words = _hf_greedy(hf, kind, 12)
    capsys.readouterr()  # the import's lines
    assert main(["generate", "--run", str(folder), "--prompt", PROMPT, "--max-new-tokens", "12", "--no-stop",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out == " ".join([PROMPT, *words]) + "\n"


def _mc_examples(hf) -> tuple[list[dict], float]:
    """Eight 4-choice examples labelled with the HF model's own choice by summed log-likelihood (read
    from its logits by hand, after the end-of-text token that begins every scored text), and the
    accuracy per byte that labelling gives."""
    g = torch.Generator().manual_seed(3)

    def words(n: int) -> list[str]:
        return [f"w{i}" for i in torch.randint(0, 62, (n,), generator=g).tolist()]

    rows, per_byte_hits = [], 0
    for _ in range(8):
        context = words(3)
        choices = [words(n) for n in (1, 2, 3, 2)]
        sums, per_byte = [], []
        for choice in choices:
            ids = torch.tensor([[0] + [word_id(w) for w in context + choice]])
            with torch.no_grad():
                logp = hf(ids).logits.log_softmax(-1)[0]
            n = len(choice)
            score = sum(logp[t - 1, ids[0, t]].item() for t in range(ids.shape[1] - n, ids.shape[1]))
            sums.append(score)
            per_byte.append(score / len((" " + " ".join(choice)).encode()))
        label = max(range(4), key=sums.__getitem__)
        per_byte_hits += max(range(4), key=per_byte.__getitem__) == label
        rows.append({"context": " ".join(context), "choices": [" ".join(c) for c in choices], "label": label})
    return rows, per_byte_hits / len(rows)


def test_eval_on_an_import_scores_as_the_hf_model(imported, tmp_path, capsys):
    hf, folder = imported
    rows, acc_per_byte = _mc_examples(hf)
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.json"
    assert main(["eval", "--run", str(folder), "--mc", str(tmp_path / "mine.jsonl"), "--out", str(out),
                 "--device", "cpu"]) == 0
    assert "CORE" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["checkpoint"] == str(folder / "model.safetensors")
    task = report["multiple_choice"]["tasks"][0]
    assert task["acc"] == 1.0  # labels are the HF model's choices: chance is 1/4 per example
    assert task["acc_per_byte"] == pytest.approx(acc_per_byte)


def _task(path, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    lines = [f"w{a} w{b}\t{int(a > b)}" for a, b in torch.randint(0, 62, (n, 2), generator=g).tolist()]
    path.write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")


def test_finetune_starts_from_the_import(imported, tmp_path, monkeypatch, capsys):
    """The encoder fine-tuning starts from is the HF model (caught as `prepare_encoder` hands it over);
    two steps are taken and the metrics written."""
    import blocklab.finetune.loop as loop

    hf, folder = imported
    _task(tmp_path / "train.tsv", 16, seed=1)
    _task(tmp_path / "dev.tsv", 8, seed=2)
    start = []

    def catching(run_dir, cfg):
        encoder, tokenizer, pooling = prepare(run_dir, cfg)
        start.append(copy.deepcopy(encoder))
        return encoder, tokenizer, pooling

    prepare = loop.prepare_encoder
    monkeypatch.setattr(loop, "prepare_encoder", catching)
    args = ["finetune", "--run", str(folder), "--train", str(tmp_path / "train.tsv"), "--eval",
            str(tmp_path / "dev.tsv"), "--task", "sst2", "--max-steps", "2", "--batch-size", "4",
            "--device", "cpu", "--out", str(tmp_path / "ft")]
    assert main(args) == 2  # a causal model: only with --allow-causal
    assert "allow_causal" in capsys.readouterr().err
    assert main(args + ["--allow-causal"]) == 0
    assert_same_logits(start[-1].eval(), hf)
    record = json.loads((tmp_path / "ft" / "metrics.json").read_text())
    assert record["steps"] == 2 and record["pooling"] == "last" and record["run"] == str(folder)
    assert len((tmp_path / "ft" / "predictions.jsonl").read_text().splitlines()) == 8


def _error(argv, capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_folders_that_are_no_model_folder_are_named(imported, tmp_path, capsys):
    hf, folder = imported
    gen = ["generate", "--prompt", PROMPT, "--device", "cpu", "--run"]
    err = _error(gen + [str(tmp_path / "nowhere")], capsys)
    assert "not a blocklab run directory (no such folder)" in err and "blocklab import-hf" in err
    (tmp_path / "empty").mkdir()
    assert "nor a blocklab export" in _error(gen + [str(tmp_path / "empty")], capsys)
    hf.save_pretrained(tmp_path / "hf")
    err = _error(["eval", "--run", str(tmp_path / "hf"), "--mc", "x.jsonl"], capsys)
    assert "a Hugging Face gpt2 checkpoint" in err
    assert f"import it first (blocklab import-hf {tmp_path / 'hf'} --out OUT)" in err

    model = load_pretrained(folder)
    save_pretrained(model, tmp_path / "bare")  # an export without a tokenizer
    assert "has no tokenizer.json" in _error(gen + [str(tmp_path / "bare")], capsys)
    save_pretrained(model, tmp_path / "no-eos", tokenizer=word_tokenizer(["<unk>", "<pad>"]))
    err = _error(gen + [str(tmp_path / "no-eos")], capsys)
    assert "none of the end-of-text tokens" in err and "id 64, past the model's 64 ids" in err


def test_python_m_blocklab_runs_the_command_line():
    def run(*argv):
        return subprocess.run([sys.executable, "-m", "blocklab", *argv], capture_output=True, text=True,
                              timeout=patient(120))

    helped = run("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: blocklab")
    assert "import-hf" in helped.stdout
    refused = run("eval", "--run", "nowhere")  # refused before anything loads: exit status 2
    assert refused.returncode == 2 and "blocklab eval needs --mc" in refused.stderr
