"""Every blocklab variant as a Hugging Face model (interop/hf_model.py, hf_remote.py): exports load in a
fresh process through transformers' Auto classes with trust_remote_code and give blocklab's logits, HF
`generate` gives blocklab's greedy tokens with blocklab's cache layout, and the ecosystem's own tools
(lm-evaluation-harness's `hf` model type, PEFT LoRA) run on them. The references are blocklab's own
forward pass and `generate` (themselves checked against float64 paper references elsewhere) and, for
LoRA, the merged weights W + (alpha / r) B A written by hand into a plain blocklab model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from blocklab import LanguageModel, ModelConfig  # noqa: E402
from blocklab.data.tokenizer import train_bpe  # noqa: E402
from blocklab.interop import from_hf, load_pretrained, save_pretrained  # noqa: E402
from timeouts import patient  # noqa: E402

ARCHS = ("pre-ln", "sas-p+resformer-learnable", "svformer", "bov")
TEXT = ["def value(self):\n    return self.value + 1\n", "for i in range(10):\n    print(i)\n",
        "class Point:\n    x = 0\n    y = 0\n"] * 20
NEW_TOKENS = 10


def perturbed(arch: str, seed: int = 0, scale: float = 0.05, **fields) -> LanguageModel:
    """A tiny model with every parameter moved off its initialisation by noise of std `scale` (many
    variants start as the identity, where wrong code could still pass)."""
    torch.manual_seed(seed)
    model = LanguageModel(ModelConfig.from_preset(arch, size="tiny", **fields)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(TEXT, vocab_size=320)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tokenizer):
    """arch -> (export folder, the blocklab model it holds)."""
    root = tmp_path_factory.mktemp("hf")
    return {arch: (save_pretrained(model, root / arch, tokenizer=tokenizer.hf, format="hf"), model)
            for arch, model in ((a, perturbed(a, i)) for i, a in enumerate(ARCHS))}


def _fresh_env(tmp_path: Path) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "HF_HOME": str(tmp_path / "hf-home"),
            "HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


FRESH = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
NEW_TOKENS, out = int(sys.argv[1]), {}
for folder in sys.argv[2:]:
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([tok("def value(self):\\n    return").input_ids])
    with torch.no_grad():
        logits = model(ids).logits
        gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True)
    cache = getattr(gen, "cache", None) or gen.past_key_values
    out[folder] = dict(cls=type(model).__name__, loaded_blocklab=("blocklab" in sys.modules),
                       ids=ids.tolist(), logits=logits.tolist(), tokens=gen.sequences.tolist(),
                       cache_bytes=cache.nbytes,
                       cache_tensors=sorted(cache.kv.tensors()), eos=tok.eos_token_id)
print(json.dumps(out))
"""


def test_exports_load_in_a_fresh_process_and_match_blocklab(exports, tokenizer, tmp_path):
    """AutoModelForCausalLM + AutoTokenizer with trust_remote_code, in a process that never imported
    blocklab: the logits (atol 1e-5, float32), greedy `generate` tokens and the cache's bytes are
    blocklab's own."""
    folders = [str(exports[a][0]) for a in ARCHS]
    done = subprocess.run([sys.executable, "-c", FRESH, str(NEW_TOKENS), *folders], capture_output=True,
                          text=True, env=_fresh_env(tmp_path), timeout=patient(600))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    cache_bytes = {}
    for arch in ARCHS:
        folder, model = exports[arch]
        got = results[str(folder)]
        ids = torch.tensor(got["ids"])
        assert ids.tolist() == [tokenizer.hf.encode("def value(self):\n    return").ids]
        assert got["cls"] == "BlocklabForCausalLM" and got["loaded_blocklab"]
        assert got["eos"] == tokenizer.eos_id
        with torch.no_grad():
            torch.testing.assert_close(torch.tensor(got["logits"]), model(ids), atol=1e-5, rtol=0)
            assert got["tokens"] == model.generate(ids, NEW_TOKENS).tolist(), arch
        reference = model.new_cache(1, model.cfg.context_length)
        assert got["cache_bytes"] == reference.nbytes and got["cache_tensors"] == sorted(reference.tensors())
        cache_bytes[arch] = got["cache_bytes"]
    # SVFormer keeps K per layer and V once: (L + 1) / (2L) of the standard K + V (L = 4 at tiny)
    layers = exports["svformer"][1].cfg.n_layers
    assert cache_bytes["svformer"] * 2 * layers == cache_bytes["pre-ln"] * (layers + 1)
    assert "token_ids" in results[str(exports["bov"][0])]["cache_tensors"]


def test_export_folder_holds_card_remote_code_and_tokenizer(exports):
    folder, model = exports["sas-p+resformer-learnable"]
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md",
            "configuration_blocklab.py", "modeling_blocklab.py", "generation_config.json"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "blocklab" and config["architectures"] == ["BlocklabForCausalLM"]
    assert config["auto_map"] == {"AutoConfig": "configuration_blocklab.BlocklabConfig",
                                  "AutoModelForCausalLM": "modeling_blocklab.BlocklabForCausalLM"}
    assert ModelConfig.from_dict(config["blocklab"]) == model.cfg
    modeling = (folder / "modeling_blocklab.py").read_text()
    assert "from blocklab.interop.hf_model import" in modeling and "def forward" not in modeling
    card = (folder / "README.md").read_text()
    assert "Simplifying Transformer Blocks" in card and "Value Residual Learning" in card
    assert "`resformer-learnable`" in card and "trust_remote_code=True" in card


def test_plain_llama_shaped_models_keep_the_native_export(tmp_path):
    model = perturbed("pre-ln", mlp_act="swiglu")  # tiny's RMSNorm and RoPE: LlamaForCausalLM
    folder = save_pretrained(model, tmp_path / "llama", format="hf")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    assert not (folder / "modeling_blocklab.py").exists()


def test_from_hf_and_load_pretrained_round_trips(exports, tmp_path):
    """HF export -> from_hf -> blocklab export -> load_pretrained: the same config and logits."""
    folder, model = exports["bov"]
    back = from_hf(folder)
    assert back.cfg == model.cfg
    again = load_pretrained(save_pretrained(back, tmp_path / "blocklab"))
    ids = torch.randint(0, model.cfg.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
        assert torch.equal(back(ids), model(ids))
    assert back.tok_emb.weight.data_ptr() != model.tok_emb.weight.data_ptr()


def test_hf_forward_loss_generate_options_and_bad_inputs():
    from blocklab.interop import to_hf
    from blocklab.interop.hf_model import CACHE_NAME

    model = perturbed("svformer")
    hf = to_hf(model).eval()
    assert hf.model is model
    ids = torch.randint(0, model.cfg.vocab_size, (3, 12))
    labels = ids.clone()
    labels[0, 5:] = -100
    with torch.no_grad():
        out = hf(ids, labels=labels)
        logits = model(ids)
    keep = labels[:, 1:] != -100
    nll = -torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    assert out.loss.item() == pytest.approx(nll[keep].mean().item(), rel=1e-5)
    # a padded row's real tokens get the logits of the row alone, padded on either side
    # (tests/interop/test_hf_padding.py covers generate); padding between real tokens is refused
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        torch.testing.assert_close(hf(ids, attention_mask=mask).logits[1, :8], model(ids[1:, :8])[0])
        left = hf(ids.flip(1), attention_mask=mask.flip(1)).logits
        torch.testing.assert_close(left[1, 4:], model(ids[1:, :8].flip(1))[0])
    with pytest.raises(ValueError, match="padding between real tokens"):
        hf(ids, attention_mask=torch.ones_like(ids).index_fill(1, torch.tensor([3]), 0))
    with pytest.raises(ValueError, match="input_ids only"):
        hf(inputs_embeds=torch.zeros(1, 3, model.cfg.d_model))
    # HF's batch expansion and a cache sized by the caller
    with torch.no_grad():
        gen = hf.generate(ids[:1], max_new_tokens=5, do_sample=True, num_return_sequences=2,
                          return_dict_in_generate=True, **{CACHE_NAME: hf.new_cache(17)})
    assert gen.sequences.shape == (2, 17)
    cache = getattr(gen, "cache", None) or gen.past_key_values
    assert cache.kv.batch_size == 2 and cache.kv.max_len == 17 and cache.get_seq_length() == 16


def test_masked_lm_export_loads_with_its_auto_class(tmp_path):
    from transformers import AutoModelForMaskedLM

    model = perturbed("pre-ln", causal=False)
    folder = save_pretrained(model, tmp_path / "enc", format="hf")
    assert "AutoModelForMaskedLM" in json.loads((folder / "config.json").read_text())["auto_map"]
    hf = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=0)
        # right padding: the real tokens see only each other
        padded = hf(ids, attention_mask=torch.ones_like(ids).index_fill(1, torch.tensor([14, 15]), 0)).logits
        torch.testing.assert_close(padded[:, :14], model(ids[:, :14]), atol=1e-5, rtol=0)


def _write_ppl_task(root: Path, texts: list[str]) -> Path:
    (root / "ppl.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "toy_ppl.yaml").write_text(
        "task: toy_ppl\ndataset_path: json\ntest_split: test\nmetadata:\n  version: 0\n"
        f"dataset_kwargs:\n  data_files:\n    test: {root / 'ppl.jsonl'}\n  cache_dir: {root / 'hf'}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: bits_per_byte\n")
    return tasks


def test_lm_eval_hf_model_type_scores_an_export(exports, tokenizer, tmp_path):
    """lm-evaluation-harness's own `hf` model (HFLM) on a local rolling-likelihood task: its bits per
    byte equal the sum of blocklab's log-probabilities of each text after the end-of-text token."""
    pytest.importorskip("lm_eval")
    from lm_eval import simple_evaluate
    from lm_eval.models import huggingface  # noqa: F401 (registers "hf": the registry may hold only ours)
    from lm_eval.tasks import TaskManager

    folder, model = exports["sas-p+resformer-learnable"]
    texts = ["def value(self):\n    return 1\n", "for i in range(3):\n    print(i)\n"]
    tasks = _write_ppl_task(tmp_path, texts)
    results = simple_evaluate(
        model="hf", model_args={"pretrained": str(folder), "trust_remote_code": True, "dtype": "float32",
                                 "device": "cpu"},
        tasks=["toy_ppl"], task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        bootstrap_iters=0, batch_size=2)["results"]["toy_ppl"]
    total = 0.0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([[tokenizer.eos_id, *tokenizer.hf.encode(text).ids]])
            logp = torch.log_softmax(model(ids)[0, :-1].double(), -1)
            total += logp.gather(-1, ids[0, 1:, None]).sum().item()
    nbytes = sum(len(t.encode()) for t in texts)
    assert results["bits_per_byte,none"] == pytest.approx(-total / nbytes / math.log(2), rel=1e-4)


def test_peft_lora_trains_saves_and_reloads(exports, tmp_path):
    """LoRA on the attention and MLP linears: one AdamW step, save, reload on a fresh load of the
    export; the adapted logits equal a plain blocklab model whose weights are W + (alpha / r) B A."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    folder, model = exports["sas-p+resformer-learnable"]
    base = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    targets = base.lora_target_modules()
    assert targets == ["fc", "k", "out", "q"]  # SAS-P's W^V and W^O are identity / reparameterised
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0)
    lora = peft.get_peft_model(base, config)
    adapted = {n.removesuffix(".lora_A").rsplit(".", 1)[-1]
               for n, _ in lora.named_modules() if n.endswith(".lora_A")}
    assert adapted == {"q", "k", "fc", "out"}
    assert all("lora_" in n for n, p in lora.named_parameters() if p.requires_grad)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 24))
    opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    loss = lora(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    lora.eval()
    with torch.no_grad():
        after = lora(input_ids=ids).logits
    assert not torch.allclose(after, model(ids))  # the step moved B off zero: LoRA now counts
    lora.save_pretrained(tmp_path / "adapter")
    fresh = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    merged = LanguageModel(model.cfg).eval()
    merged.load_state_dict(model.state_dict())
    params = dict(merged.named_parameters())
    with torch.no_grad():
        for name, module in lora.named_modules():
            if name.endswith((".q", ".k", ".fc", ".out")) and hasattr(module, "lora_A"):
                delta = (module.lora_B["default"].weight @ module.lora_A["default"].weight) * (8 / 4)
                params[name.removeprefix("base_model.model.model.") + ".weight"].add_(delta)
        torch.testing.assert_close(reloaded(input_ids=ids).logits, after, atol=1e-6, rtol=0)
        torch.testing.assert_close(merged(ids), after, atol=1e-5, rtol=0)
    assert math.isfinite(loss.item())
    # merged into the weights and saved by transformers: the folder loads again with trust_remote_code
    reloaded.merge_and_unload().save_pretrained(tmp_path / "merged")
    code = ("import sys, torch; from transformers import AutoModelForCausalLM as A; "
            "m = A.from_pretrained(sys.argv[1], trust_remote_code=True).eval(); "
            "print(m(torch.tensor([list(map(int, sys.argv[2:]))])).logits[0].tolist())")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "merged"), *map(str, ids[0].tolist())],
                          capture_output=True, text=True, env=_fresh_env(tmp_path), timeout=patient(300))
    assert done.returncode == 0, done.stderr[-2000:]
    fresh_logits = torch.tensor(json.loads(done.stdout.splitlines()[-1]))
    torch.testing.assert_close(fresh_logits, after[0], atol=1e-5, rtol=0)


def test_hf_export_without_transformers_names_the_extra(monkeypatch, tmp_path):
    """Without transformers, format="hf" fails before any folder is touched, naming the extra."""
    import builtins

    real = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("no transformers")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(ImportError, match=r"blocklab\[hf\]"):
        save_pretrained(perturbed("svformer"), tmp_path / "x", format="hf")
    assert not (tmp_path / "x").exists()


def test_logits_to_keep_gives_the_last_positions():
    from blocklab.interop.hf_model import hf_model

    model = perturbed("bov")
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf_model(model)(ids, logits_to_keep=1).logits, model(ids)[:, -1:],
                                   atol=1e-5, rtol=0)


def test_cli_exports_a_trained_run_with_its_card(tmp_path, capsys):
    """`blocklab export --format hf` of a SAS-P + SVFormer run: remote code with the run's training
    record in the card, and the run's byte tokenizer through AutoTokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from blocklab.cli import main
    from blocklab.training import load_run
    from helpers import write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus, run, out = write_code_corpus(tmp_path / "corpus"), tmp_path / "run", tmp_path / "hf"
    assert main(["train", "arch=sas-p+svformer", f"data.source={corpus}", "data.tokenizer=byte",
                 f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32", "model.n_layers=2",
                 "model.n_heads=2", "batch_size=2", "seq_len=16", "max_steps=2", "progress=false",
                 "--out", str(run)]) == 0
    assert main(["export", "--run", str(run), "--out", str(out), "--format", "hf"]) == 0
    assert "trust_remote_code=True" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert f"`{run.name}`" in card and "- 2 steps" in card and "validation loss" in card
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(out)
    loaded = load_run(run)
    text = "def f(x):"  # within the run's 16 positions
    assert tok(text).input_ids == loaded.tokenizer.encode(text)
    ids = torch.tensor([loaded.tokenizer.encode(text)])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, loaded.model(ids), atol=1e-5, rtol=0)


def _every_arch() -> list[str]:
    from blocklab.model.presets import BLOCK_PRESETS
    from blocklab.model.value_paths import VALUE_PATHS

    return [*BLOCK_PRESETS, *(f"pre-ln+{p}" for p in VALUE_PATHS if p != "standard"), "sas-p+svformer",
            "sas-p+bov"]


SMALL = dict(n_layers=3, d_model=32, n_heads=2, mlp_hidden=64, vocab_size=96, context_length=32)


@pytest.mark.parametrize("arch", _every_arch())
def test_every_variant_saves_loads_and_generates_through_the_auto_class(arch, tmp_path):
    """Each block preset and value path: save_pretrained -> AutoModelForCausalLM (registered classes,
    no remote code), with every tensor loaded (transformers' own load report: none missing, none left
    over) -> exactly blocklab's logits (float32), also through from_hf, and HF greedy `generate`
    gives blocklab's tokens. On transformers 4.45 the gains of shaped attention once loaded into
    nothing (their names held "beta" and "gamma"): logits off by 0.1."""
    from transformers import AutoModelForCausalLM

    import blocklab.interop.hf_model  # noqa: F401 (registers model_type "blocklab")

    model = perturbed(arch, **SMALL)
    folder = save_pretrained(model, tmp_path / "hf", format="hf")
    hf, report = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(report.values()), report
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids)
        assert torch.equal(hf.eval()(ids).logits, want)
        assert torch.equal(from_hf(folder)(ids), want)
        assert torch.equal(hf.generate(ids, max_new_tokens=6, do_sample=False), model.generate(ids, 6))


@pytest.mark.parametrize("arch", ["shaped", "sas-p", "pre-ln+bov"])
def test_a_meta_device_load_fills_every_tensor(arch, tmp_path):
    """``device_map`` (as lm-evaluation-harness loads) builds the model on the meta device and puts each
    tensor in place by walking attributes named by the checkpoint's keys: on transformers 4.45 the export
    names of shaped attention's gains (gain_a, gain_c) were no attribute there (AttributeError)."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    import blocklab.interop.hf_model  # noqa: F401 (registers model_type "blocklab")

    model = perturbed(arch, **SMALL)
    folder = save_pretrained(model, tmp_path / "hf", format="hf")
    hf, report = AutoModelForCausalLM.from_pretrained(folder, device_map={"": "cpu"},
                                                      output_loading_info=True)
    assert not any(report.values()), report
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(hf.eval()(ids).logits, model(ids))


@pytest.mark.parametrize("arch", _every_arch())
def test_exported_tensor_names_stay_clear_of_transformers_renames(arch):
    """transformers 4.x (4.45) renames checkpoint keys holding "beta" or "gamma" while it loads: no
    tensor behind HF's classes has one, and each name maps back to one blocklab tensor."""
    from blocklab.interop.export_names import blocklab_name
    from blocklab.interop.hf_model import hf_model

    model = LanguageModel(ModelConfig.from_preset(arch, size="tiny", **SMALL))
    names = list(hf_model(model).state_dict())
    assert not [n for n in names if "beta" in n or "gamma" in n]
    assert sorted(blocklab_name(n) for n in names) == sorted("model." + n for n in model.state_dict())


OLD_EXPORT = Path(__file__).resolve().parents[1] / "fixtures" / "hf-export-blocklab-names" / "shaped-export"


def test_an_export_written_with_blocklab_names_still_loads():
    """tests/fixtures/hf-export-blocklab-names (written before the export names: ``attn.beta.gain``,
    ``attn.gamma.gain``) loads through the Auto class and from_hf with every tensor, giving the logits of a
    blocklab model holding the file's tensors as they are (read with safetensors, no transformers
    involved)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    import blocklab.interop.hf_model  # noqa: F401 (registers model_type "blocklab")

    state = load_file(OLD_EXPORT / "model.safetensors")
    assert "model.blocks.0.attn.beta.gain" in state and "model.blocks.1.attn.gamma.gain" in state
    reference = LanguageModel(ModelConfig.from_dict(json.loads((OLD_EXPORT / "config.json").read_text())
                                                  ["blocklab"])).eval()
    reference.load_state_dict({k.removeprefix("model."): v for k, v in state.items()}, strict=True)
    gains = [g for b in reference.blocks for g in (b.attn.beta.gain, b.attn.gamma.gain)]
    assert all((g - 1.0).abs().min() > 1e-3 for g in gains)  # far from their init (1)
    hf, report = AutoModelForCausalLM.from_pretrained(OLD_EXPORT, output_loading_info=True)
    assert not any(report.values()), report
    ids = torch.randint(0, reference.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = reference(ids)
        assert torch.equal(hf.eval()(ids).logits, want)
        assert torch.equal(from_hf(OLD_EXPORT)(ids), want)


def test_from_hf_refuses_tensors_missing_or_left_over(tmp_path):
    """A folder whose tensors transformers does not load one for one (its load report) is refused,
    naming them, rather than giving a model with some weights at their init."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from blocklab.util.errors import ConfigError

    folder = save_pretrained(perturbed("sas-p", **SMALL), tmp_path / "hf", format="hf")
    file = folder / "model.safetensors"
    with safe_open(str(file), framework="pt") as f:
        metadata = f.metadata()
    state = load_file(file)
    save_file({k: v for k, v in state.items() if k != "model.blocks.2.attn.gain_a.gain"}, str(file),
              metadata=metadata)
    with pytest.raises(ConfigError, match=r"which would be filled at random: model\.blocks\.2\.attn\.gain_a"):
        from_hf(folder)
    save_file({**state, "model.blocks.0.attn.extra": torch.ones(3)}, str(file), metadata=metadata)
    with pytest.raises(ConfigError, match=r"which would be dropped: model\.blocks\.0\.attn\.extra"):
        from_hf(folder)


def test_bench_hf_generate_quick_run_checks_tokens_and_cache(tmp_path):
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    out = tmp_path / "hf-generate.json"
    cmd = [sys.executable, str(bench / "bench_hf_generate.py"), "--quick", "--archs", "svformer",
           "--batches", "2", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=patient(300), env=_fresh_env(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    cell = json.loads(out.read_text())["cells"][0]
    assert "| svformer | 2 |" in done.stdout and cell["cache_bytes"] == 2 * 327_680  # 0.625x of pre-ln's
