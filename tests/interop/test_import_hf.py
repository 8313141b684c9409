"""`blocklab import-hf`: Hugging Face checkpoint folders into blocklab exports, and `init_from` on them.

References: the HF `transformers` models themselves (their logits, float32) and HF's own tokenizers;
for blocklab's HF exports, the blocklab model that was exported. Every model is perturbed away from
its initialisation (test_interop.perturb), so that a transpose or a dropped weight shows.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from blocklab.cli import main  # noqa: E402
from blocklab.interop import load_pretrained, load_tokenizer, save_pretrained  # noqa: E402
from tests.interop.test_hf import blocklab_model, hf_exportable, perturb  # noqa: E402

VOCAB, CONTEXT = 64, 32
SPECIALS = {"gpt2": ["<|endoftext|>", "<unk>"], "llama": ["<unk>", "<s>", "</s>"]}
TEXT = "w3 w14 w1 w59 w8 w27"


def word_tokenizer(specials: list[str]) -> Tokenizer:
    """A whitespace WordLevel tokenizer that fills the model's vocabulary exactly, as GPT-2's and
    Llama's do (no room for a mask token)."""
    words = specials + [f"w{i}" for i in range(VOCAB - len(specials))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return tok


def hf_model(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=CONTEXT,
                         attn_implementation="eager")
        return perturb(GPT2LMHeadModel(cfg), seed)
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=CONTEXT,
                      rope_theta=500.0, attn_implementation="eager")
    return perturb(LlamaForCausalLM(cfg), seed)


def hf_folder(kind: str, path, shard: bool = False, tokenizer: bool = True):
    """A tiny perturbed HF model of `kind` saved with transformers' save_pretrained (in shards with
    `shard`), with its fast tokenizer; returns the model."""
    model = hf_model(kind)
    model.save_pretrained(path, **({"max_shard_size": "20KB"} if shard else {}))
    if tokenizer:
        specials = SPECIALS[kind]
        fast = PreTrainedTokenizerFast(tokenizer_object=word_tokenizer(specials), unk_token="<unk>",
                                       eos_token=specials[0] if kind == "gpt2" else "</s>")
        fast.save_pretrained(path)
    return model


def ids(seed: int = 0, t: int = 11) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, t), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def assert_same_logits(ours, hf) -> None:
    x = ids()
    want = hf(x).logits
    assert want.abs().max() > 1.0  # far from zero: the comparison has teeth
    torch.testing.assert_close(ours.eval()(x), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind, shard", [("gpt2", False), ("llama", True)])
def test_import_gives_the_hf_logits_and_carries_the_tokenizer(kind, shard, tmp_path, capsys):
    hf = hf_folder(kind, tmp_path / "hf", shard=shard)
    if shard:
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"imported the {kind} checkpoint" in out and "tokenizer.json carried" in out
    assert f"init_from={tmp_path / 'out'}" in out
    assert_same_logits(load_pretrained(tmp_path / "out"), hf)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(TEXT, add_special_tokens=False)
    assert load_tokenizer(tmp_path / "out").encode(TEXT).ids == reference.input_ids


def test_the_printed_command_pastes_as_one_word_per_argument(tmp_path, capsys):
    """import-hf's hint printed `init_from=exp/odd name ü 'q' $HOME;x/back` unquoted: pasted, the shell
    split it at the spaces, expanded $HOME and ran what followed the `;`."""
    import shlex

    hf_folder("gpt2", tmp_path / "hf")
    out = tmp_path / "odd name ü 'q' $HOME;x" / "back"
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    [hint] = [line for line in lines if line.startswith("continue pretraining")]
    words = shlex.split(hint.removeprefix("continue pretraining: "))
    assert words == ["blocklab", "train", f"init_from={out}", "max_steps=...", "--out", "RUN"]


def test_a_tokenizer_without_tokenizer_json_is_converted(tmp_path, capsys):
    """GPT-2's slow files (vocab.json, merges.txt) become a tokenizer.json that encodes alike."""
    hf = hf_folder("gpt2", tmp_path / "hf", tokenizer=False)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(["the value residual of a bank of values"] * 20,
                            trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"]))
    bpe.model.save(str(tmp_path / "hf"))
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "converted to tokenizer.json from tokenizer_config.json, vocab.json, merges.txt" in out
    text = "the values of a bank"
    assert load_tokenizer(tmp_path / "out").encode(text).ids == bpe.encode(text).ids
    assert_same_logits(load_pretrained(tmp_path / "out"), hf)


def test_without_tokenizer_files_the_import_says_so(tmp_path, capsys):
    hf = hf_folder("llama", tmp_path / "hf", tokenizer=False)
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")]) == 0
    assert "no tokenizer carried" in capsys.readouterr().out
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    assert_same_logits(load_pretrained(tmp_path / "out"), hf)


EXPORTS = {"remote-sas-p": lambda: blocklab_model("sas-p", vocab_size=VOCAB),
           "native-gpt2-like": lambda: hf_exportable("gpt2-like-tied-bias")}


@pytest.mark.parametrize("name", EXPORTS)
def test_blocklab_hf_exports_round_trip(name, tmp_path):
    model = EXPORTS[name]().float().eval()
    tok = word_tokenizer(SPECIALS["gpt2"])
    save_pretrained(model, tmp_path / "hf", tokenizer=tok, format="hf")
    remote = (tmp_path / "hf" / "modeling_blocklab.py").is_file()
    assert remote == (name == "remote-sas-p")
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")]) == 0
    back = load_pretrained(tmp_path / "out")
    if remote:  # the same ModelConfig, not only the same function
        assert back.cfg == model.cfg
    x = ids(t=9) % model.cfg.vocab_size
    with torch.no_grad():
        assert model(x).abs().max() > 1.0
        assert torch.equal(back.eval()(x), model(x))  # the same tensors and code: bit for bit
    assert load_tokenizer(tmp_path / "out").encode(TEXT).ids == tok.encode(TEXT).ids


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Text in the tiny tokenizers' words, so that no token is unknown."""
    root = tmp_path_factory.mktemp("words")
    for i in range(16):
        (root / f"d{i}.txt").write_text("\n".join(" ".join(f"w{(i * j + k) % 61}" for k in range(12))
                                                  for j in range(30)))
    return root


@pytest.mark.parametrize("source", ["import", "hf-folder"])
def test_train_init_from_starts_from_the_hf_weights(source, corpus, tmp_path):
    """With learning rate 0 the trained run is the HF model: training started from its weights, with
    its tokenizer, although that tokenizer leaves no id for blocklab's mask token."""
    from blocklab.training import load_run

    hf = hf_folder("llama", tmp_path / "hf")
    src = tmp_path / "hf"
    if source == "import":
        assert main(["import-hf", str(src), "--out", str(tmp_path / "imported")]) == 0
        src = tmp_path / "imported"
    args = ["train", f"init_from={src}", "max_steps=2", "batch_size=4", "seq_len=16", "eval_every=0",
            "eval_batches=1", "progress=false", "optim.lr=0", "optim.warmup_fraction=0",
            f"data.source={corpus}", "data.val_fraction=0.3", f"data.cache_dir={tmp_path / 'cache'}",
            "--out", str(tmp_path / "run")]
    assert main(args) == 0
    run = load_run(tmp_path / "run")
    assert run.model.cfg.vocab_size == VOCAB and run.tokenizer.eos_token == "</s>"
    assert_same_logits(run.model, hf)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert run.tokenizer.encode(TEXT) == reference(TEXT, add_special_tokens=False).input_ids


def test_init_from_an_unsupported_hf_folder_names_its_model_type(corpus, tmp_path, capsys):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    args = ["train", f"init_from={tmp_path / 'bert'}", "max_steps=1", "progress=false",
            f"data.source={corpus}", f"data.cache_dir={tmp_path / 'cache'}", "--out", str(tmp_path / "run")]
    assert main(args) == 2
    assert "model_type = 'bert'" in capsys.readouterr().err


def _error(argv, capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_import_errors(tmp_path, capsys):
    hf_folder("gpt2", tmp_path / "hf")
    out = str(tmp_path / "out")
    assert "is not a folder" in _error(["import-hf", str(tmp_path / "nowhere"), "--out", out], capsys)
    (tmp_path / "empty").mkdir()
    assert "no config.json" in _error(["import-hf", str(tmp_path / "empty"), "--out", out], capsys)
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    err = _error(["import-hf", str(tmp_path / "bert"), "--out", out], capsys)
    assert "model_type = 'bert'" in err and "'gpt2', 'llama', 'blocklab'" in err
    save_pretrained(blocklab_model("pre-ln"), tmp_path / "ours")
    assert "already a blocklab export" in _error(["import-hf", str(tmp_path / "ours"), "--out", out], capsys)
    assert "checkpoint folder itself" in _error(["import-hf", str(tmp_path / "hf"), "--out",
                                                 str(tmp_path / "hf")], capsys)
    assert not (tmp_path / "out").exists()  # nothing written by a refused import

    # an existing --out: refused; --overwrite replaces an earlier export, never other files
    assert main(["import-hf", str(tmp_path / "hf"), "--out", out]) == 0
    assert "--overwrite" in _error(["import-hf", str(tmp_path / "hf"), "--out", out], capsys)
    assert main(["import-hf", str(tmp_path / "hf"), "--out", out, "--overwrite"]) == 0
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    err = _error(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"), "--overwrite"], capsys)
    assert "metrics.jsonl" in err and (tmp_path / "run" / "metrics.jsonl").read_text() == "{}\n"
    (tmp_path / "hf" / "tokenizer.json").write_text("{torn")
    err = _error(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "new")], capsys)
    assert "tokenizer.json is not a readable tokenizer" in err and not (tmp_path / "new").exists()


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path, capsys):
    hf_folder("gpt2", tmp_path / "hf", tokenizer=False)
    tok = word_tokenizer(SPECIALS["gpt2"])
    tok.add_tokens(["w-extra"])
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    err = _error(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], capsys)
    assert f"has {VOCAB + 1} tokens but its model only {VOCAB}" in err


@pytest.mark.parametrize("kind", ["gpt2", "remote-sas-p"])
def test_import_refuses_tensors_that_do_not_load_one_for_one(kind, tmp_path, capsys):
    """A checkpoint with a tensor its model has no place for (or lacking one) is refused, naming it:
    imported, it would give other logits than the model that was saved."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hf"
    if kind == "gpt2":
        hf_folder("gpt2", folder)
    else:
        save_pretrained(EXPORTS[kind]().float(), folder, tokenizer=word_tokenizer(SPECIALS["gpt2"]),
                        format="hf")
    file = folder / "model.safetensors"
    with safe_open(str(file), framework="pt") as f:
        metadata = f.metadata()
    state = load_file(file)
    extra = "transformer.h.0.mlp.extra" if kind == "gpt2" else "model.blocks.0.mlp.extra"
    save_file({**state, extra: torch.ones(2)}, str(file), metadata=metadata)
    err = _error(["import-hf", str(folder), "--out", str(tmp_path / "out")], capsys)
    assert f"which would be dropped: {extra}" in err and not (tmp_path / "out").exists()
    first = sorted(state)[0]
    save_file({k: v for k, v in state.items() if k != first}, str(file), metadata=metadata)
    err = _error(["import-hf", str(folder), "--out", str(tmp_path / "out")], capsys)
    assert f"which would be filled at random: {first}" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["import-hf", "init_from"])
@pytest.mark.parametrize("kind, removed", [("llama", "model.layers.1.mlp.down_proj.weight"),
                                           ("gpt2", "transformer.h.1.mlp.c_proj.weight")])
def test_missing_or_unexpected_weights_are_refused_naming_them(kind, removed, command, corpus, tmp_path,
                                                               capsys):
    """A weight taken out of model.safetensors was filled at random, and an extra one dropped, exit 0
    ("imported the llama checkpoint"): each is named, exit 2, and nothing is written."""
    from safetensors.torch import load_file, save_file

    hf_folder(kind, tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    whole = {k: v.clone() for k, v in load_file(weights).items()}  # no view of the file it rewrites
    capsys.readouterr()  # save_pretrained's progress bar
    for label, change in (("missing", lambda s: s.pop(removed)),
                          ("extra", lambda s: s.update({"model.extra.weight": torch.ones(3)}))):
        state = dict(whole)
        change(state)
        save_file(state, weights, metadata={"format": "pt"})
        out = tmp_path / f"out-{label}"
        if command == "import-hf":
            argv = ["import-hf", str(tmp_path / "hf"), "--out", str(out)]
        else:
            argv = ["train", f"init_from={tmp_path / 'hf'}", "max_steps=1", "batch_size=2", "seq_len=16",
                    "progress=false", f"data.source={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
                    "--out", str(out)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1].startswith("blocklab: error: ") and "Traceback" not in err
        if label == "missing":
            assert f"missing weights, which would be filled at random: {removed}" in err
        else:
            assert "weights the model has no place for, which would be dropped: model.extra.weight" in err
        assert not (out / "model.safetensors").exists() and not (out / "checkpoints").exists()


def _rewrite_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))


def _reshaped(folder, name: str, shape) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    state[name] = torch.zeros(shape)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


def _shard(folder, number: int):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder / sorted(set(index["weight_map"].values()))[number]


def _as_pickle(folder) -> None:
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


# damage done to a saved HF folder -> (kind, sharded, words the one error line holds); each gave a
# traceback (or, for pytorch_model.bin, an import of a pickle) before
DAMAGE = {
    "truncated": ("llama", False, lambda f: os.truncate(f / "model.safetensors", 3000),
                  ["model.safetensors is not a readable safetensors file (3000 bytes;", "damaged"]),
    "empty": ("llama", False, lambda f: (f / "model.safetensors").write_bytes(b""),
              ["model.safetensors is not a readable safetensors file (it is empty (0 bytes))"]),
    "corrupted-header": ("gpt2", False,
                         lambda f: f.joinpath("model.safetensors").write_bytes(
                             f.joinpath("model.safetensors").read_bytes()[:8] + b"X" * 16
                             + f.joinpath("model.safetensors").read_bytes()[24:]),
                         ["model.safetensors is not a readable safetensors file", "header"]),
    "index-not-json": ("llama", True, lambda f: (f / "model.safetensors.index.json").write_text("{torn"),
                       ["model.safetensors.index.json is not valid JSON"]),
    "index-without-weight-map": ("llama", True,
                                 lambda f: (f / "model.safetensors.index.json").write_text("{}"),
                                 ['model.safetensors.index.json has no "weight_map"']),
    "index-names-a-missing-shard": ("llama", True, lambda f: _shard(f, 1).unlink(),
                                    ["model.safetensors.index.json names the shard model-00002-of-",
                                     "which is not in the folder"]),
    "pytorch_model.bin": ("llama", False, _as_pickle,
                          ["pytorch_model.bin, a pickle", "Convert the checkpoint to safetensors"]),
    "gpt2-heads": ("gpt2", False, lambda f: _rewrite_config(f, n_head=5),
                   ["config.json has n_embd = 32 and n_head = 5: the heads must divide the hidden size"]),
    "llama-heads": ("llama", False, lambda f: _rewrite_config(f, num_attention_heads=5, num_key_value_heads=5,
                                                              head_dim=None),
                    ["config.json has hidden_size = 32 and num_attention_heads = 5"]),
    "wrong-shape": ("llama", False, lambda f: _reshaped(f, "model.layers.0.mlp.down_proj.weight", (32, 40)),
                    ["weights of another shape than the config gives: model.layers.0.mlp.down_proj.weight "
                     "(32x40 in the file, 32x48 by the config)"]),
    "float8-dtype": ("llama", False, lambda f: _rewrite_config(f, dtype="float8_e4m3fn", torch_dtype=None),
                     ["config.json has dtype = 'float8_e4m3fn'", "float32, bfloat16, float16, float64"]),
}


@pytest.mark.parametrize("command", ["import-hf", "init_from"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_or_unusable_checkpoint_is_one_error_line(damage, command, corpus, tmp_path, capsys):
    kind, shard, change, words = DAMAGE[damage]
    folder = tmp_path / "hf"
    hf_folder(kind, folder, shard=shard)
    change(folder)
    out = tmp_path / "out"
    if command == "import-hf":
        argv = ["import-hf", str(folder), "--out", str(out)]
    else:
        argv = ["train", f"init_from={folder}", "max_steps=1", "batch_size=2", "seq_len=16", "progress=false",
                f"data.source={corpus}", f"data.cache_dir={tmp_path / 'cache'}", "--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert errors == [err.strip().splitlines()[-1]] and errors[0].startswith("blocklab: error: "), err
    assert "LOAD REPORT" not in err and "weights_only" not in err
    for word in words:
        assert word in err, (word, err)
    assert not (out / "model.safetensors").exists() and not (out / "checkpoints").exists()
