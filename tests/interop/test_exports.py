"""Hugging Face exports as users load them (interop/hf_export.py, hf_remote.py, model_card.py): the
tokenizer pads, the tokenizer of a remote-code export loads alone without asking to run code, and
every export carries a model card that names its preset and paper and a generation_config.json.

References: blocklab's own tokenizers (byte and BPE) for every encoding; HF `generate` on each prompt
alone for padded batches; `ModelConfig.from_preset` for the preset a card names; huggingface_hub's
`ModelCard` parser for the card's front matter; transformers' own loaders in a fresh process, with
blocklab made unimportable, for what loads without blocklab.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from blocklab import LanguageModel, ModelConfig  # noqa: E402
from blocklab.data.tokenizer import byte_tokenizer, train_bpe  # noqa: E402
from blocklab.interop import save_pretrained  # noqa: E402
from blocklab.interop.model_card import BANK_OF_VALUES, SIMPLIFYING, VALUE_RESIDUAL, architecture  # noqa: E402
from blocklab.model.presets import BLOCK_PRESETS  # noqa: E402
from helpers import SMALL  # noqa: E402
from reference import perturb  # noqa: E402
from timeouts import patient  # noqa: E402

CORPUS = ["def value(self):\n    return self.value + 1\n", "for i in range(10):\n    print(i)\n",
          "class Point:\n    x = 0\n    y = 0\n"] * 20
PROMPTS = ["def f(x):", "ab", "import os\nimport sys <|endoftext|> x"]  # lengths differ: padding needed
GPT2_LIKE = dict(norm="layernorm", positions="learned", mlp_act="gelu_tanh", bias=True)
LLAMA_LIKE = dict(norm="rmsnorm", positions="rope", mlp_act="swiglu", n_kv_heads=2, tie_embeddings=False)


@pytest.fixture(scope="module")
def tokenizers():
    """blocklab's two tokenizers: bytes (eos id 256) and a BPE trained here (eos id 0)."""
    return {"byte": byte_tokenizer(), "bpe": train_bpe(CORPUS, vocab_size=300)}


def model_of(arch: str, vocab: int, seed: int = 0, **fields) -> LanguageModel:
    torch.manual_seed(seed)
    fields = {**SMALL, "context_length": 48, "vocab_size": vocab, **fields}
    cfg = ModelConfig.from_preset(arch, "tiny", **fields)
    with torch.no_grad():
        return perturb(LanguageModel(cfg).double(), seed=seed + 100, scale=0.5).eval()


def hf_tokenizer(folder: Path):
    # trust_remote_code=False: how a remote-code export's tokenizer loads alone (see the card)
    return transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)


def front_matter(card: Path) -> dict:
    hub = pytest.importorskip("huggingface_hub")
    return hub.ModelCard.load(card).data.to_dict()


# -- 1. the exported tokenizer pads --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["byte", "bpe"])
@pytest.mark.parametrize("export", ["llama", "sas"])
def test_exported_tokenizer_pads_on_the_left_with_the_end_of_text_token(kind, export, tokenizers, tmp_path):
    """Padded batches: each row is blocklab's encoding of its prompt after end-of-text pads, masked
    out; the model config and generation_config.json carry the pad id."""
    tok = tokenizers[kind]
    fields = LLAMA_LIKE if export == "llama" else {}
    model = model_of("pre-ln" if export == "llama" else "sas", tok.vocab_size, **fields)
    folder = save_pretrained(model, tmp_path / "hf", tokenizer=tok, format="hf")
    assert json.loads((folder / "config.json").read_text())["model_type"] == (
        "llama" if export == "llama" else "blocklab")
    hf = hf_tokenizer(folder)
    assert (hf.pad_token, hf.pad_token_id, hf.padding_side) == (tok.eos_token, tok.eos_id, "left")
    batch = hf(PROMPTS, padding=True)
    width = max(len(tok.encode(p)) for p in PROMPTS)
    for prompt, ids, mask in zip(PROMPTS, batch.input_ids, batch.attention_mask, strict=True):
        ours = tok.encode(prompt)  # the literal "<|endoftext|>" is text here, as in training
        pads = width - len(ours)
        assert ids == [tok.eos_id] * pads + ours and mask == [0] * pads + [1] * len(ours)
        assert hf.decode(ids[pads:]) == tok.decode(ours) == prompt
    config = json.loads((folder / "config.json").read_text())
    generation = transformers.GenerationConfig.from_pretrained(folder)
    for source in (config, generation.to_dict()):
        assert (source["pad_token_id"], source["eos_token_id"], source["bos_token_id"]) == (tok.eos_id,) * 3


@pytest.mark.parametrize("target", ["gpt2", "llama"])
def test_native_export_generates_a_padded_batch_as_each_prompt_alone(target, tokenizers, tmp_path):
    """HF `generate` on the padded batch gives each prompt's own greedy tokens and logs no warning;
    the same batch padded on the right (the control) gives other tokens, and HF warns."""
    tok = tokenizers["byte"]
    model = model_of("pre-ln", tok.vocab_size, **(GPT2_LIKE if target == "gpt2" else LLAMA_LIKE))
    folder = save_pretrained(model, tmp_path / "hf", tokenizer=tok, format="hf")
    hf, hf_tok = transformers.AutoModelForCausalLM.from_pretrained(folder), hf_tokenizer(folder)
    assert hf.config.model_type == target
    new = 6
    alone = [hf.generate(**hf_tok([p], return_tensors="pt"), max_new_tokens=new, do_sample=False)[0, -new:]
             for p in PROMPTS]
    logged, verbosity = _Records(), transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()  # other test files turn HF's warnings off
    logging.getLogger("transformers").addHandler(logged)
    try:
        left = hf.generate(**hf_tok(PROMPTS, padding=True, return_tensors="pt"), max_new_tokens=new,
                           do_sample=False)[:, -new:]
        assert logged.messages == []
        hf_tok.padding_side = "right"
        right = hf.generate(**hf_tok(PROMPTS, padding=True, return_tensors="pt"), max_new_tokens=new,
                            do_sample=False)[:, -new:]
    finally:
        logging.getLogger("transformers").removeHandler(logged)
        transformers.logging.set_verbosity(verbosity)
    assert torch.equal(left, torch.stack(alone))
    assert not torch.equal(right, torch.stack(alone)) and any("right-padding" in m for m in logged.messages)


class _Records(logging.Handler):
    """The messages transformers logs (its logger does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_encoder_export_pads_on_the_right_and_names_its_mask_token(tokenizers, tmp_path):
    tok = tokenizers["bpe"]
    folder = save_pretrained(model_of("pre-ln", tok.vocab_size, causal=False), tmp_path / "hf", tokenizer=tok,
                             format="hf")
    hf = hf_tokenizer(folder)
    assert (hf.padding_side, hf.pad_token_id, hf.mask_token, hf.mask_token_id) == (
        "right", tok.eos_id, tok.mask_token, tok.mask_id)
    assert not (folder / "generation_config.json").exists()  # no generate for an encoder
    meta = front_matter(folder / "README.md")
    assert meta["pipeline_tag"] == "fill-mask"


# -- 2. a remote-code export's tokenizer loads alone ----------------------------------------------
LOAD_WITHOUT_BLOCKLAB = r"""
import builtins, json, sys
sys.modules["blocklab"] = None  # as on a machine without blocklab: importing it fails
asked = []
builtins.input = lambda prompt="": asked.append(prompt) or "n"  # transformers' "run the custom code?"
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast
native, remote, text = sys.argv[1:4]
out = {"native_class": type(AutoModelForCausalLM.from_pretrained(native)).__name__,
       "native_ids": AutoTokenizer.from_pretrained(native)(text).input_ids,
       "native_pad": GenerationConfig.from_pretrained(native).pad_token_id}
loaders = {"false": lambda: AutoTokenizer.from_pretrained(remote, trust_remote_code=False),
           "fast": lambda: PreTrainedTokenizerFast.from_pretrained(remote),
           "bare": lambda: AutoTokenizer.from_pretrained(remote)}
for name, load in loaders.items():
    before = len(asked)
    tok = load()
    out[name] = {"asked": len(asked) - before, "ids": tok(text).input_ids, "pad": tok.pad_token_id}
print(json.dumps(out))
"""


def test_remote_code_tokenizer_and_native_export_load_without_blocklab(tokenizers, tmp_path):
    """In a fresh process where blocklab cannot be imported, with stdin closed: the native export
    loads whole; the remote-code export's tokenizer loads with trust_remote_code=False (the card's
    way) or as PreTrainedTokenizerFast without asking to run code, and encodes as blocklab does.
    The bare AutoTokenizer call asks (transformers 5 reads config.json's auto_map first): this shows
    that the harness sees a question when there is one."""
    tok = tokenizers["bpe"]
    native = save_pretrained(model_of("pre-ln", tok.vocab_size, **LLAMA_LIKE), tmp_path / "native",
                             tokenizer=tok, format="hf")
    remote = save_pretrained(model_of("sas-p+svformer", tok.vocab_size), tmp_path / "remote", tokenizer=tok,
                             format="hf")
    text = "def value(self):\n    return <|endoftext|>"
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_MODULES_CACHE": str(tmp_path / "mods"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    run = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_BLOCKLAB, str(native), str(remote), text],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=patient(120),
                         env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    ours = tok.encode(text)
    assert out["native_class"] == "LlamaForCausalLM" and out["native_ids"] == ours
    assert out["native_pad"] == tok.eos_id
    for name in ("false", "fast"):
        assert out[name] == {"asked": 0, "ids": ours, "pad": tok.eos_id}, name
    assert out["bare"]["ids"] == ours
    if int(transformers.__version__.split(".")[0]) == 5:
        assert out["bare"]["asked"] == 1


def test_text_generation_pipeline_loads_a_remote_code_export_with_its_tokenizer(tokenizers, tmp_path,
                                                                                monkeypatch):
    """`pipeline("text-generation", model=FOLDER, trust_remote_code=True)` as a user calls it: in
    transformers 4.x it loads a tokenizer only when config.json names its class (the model type
    "blocklab" is in no tokenizer mapping), and failed without one. Reference: blocklab's greedy
    `generate` on the prompt's ids from the model exported, and the text blocklab's tokenizer decodes."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "mods"))
    tok = tokenizers["bpe"]
    model = model_of("sas-p+svformer", tok.vocab_size)
    folder = save_pretrained(model, tmp_path / "remote", tokenizer=tok, format="hf")
    assert json.loads((folder / "config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    generator = transformers.pipeline("text-generation", model=str(folder), trust_remote_code=True)
    prompt = "def value(self):"
    ids = tok.encode(prompt)
    expected = model.generate(torch.tensor([ids]), 6, stop_tokens=[tok.eos_id])[0].tolist()
    got = generator(prompt, max_new_tokens=6, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    assert list(got) == expected
    text = generator(prompt, max_new_tokens=6, do_sample=False)[0]["generated_text"]
    assert text == prompt + tok.decode([i for i in expected[len(ids):] if i != tok.eos_id])
    plain = save_pretrained(model, tmp_path / "no-tokenizer", format="hf")  # no tokenizer: none named
    assert json.loads((plain / "config.json").read_text()).get("tokenizer_class") is None


# -- 3. the card names the preset and its paper ---------------------------------------------------
CARDS = {  # arch: (what the card's title names, the papers it cites, their arXiv tags)
    "pre-ln": ("Pre-LN block", [SIMPLIFYING], ["2311.01906"]),
    "sas": ("skipless simplified attention sub-block (SAS), sequential", [SIMPLIFYING], ["2311.01906"]),
    "sas-p+bov": ("SAS in parallel form", [SIMPLIFYING, BANK_OF_VALUES], ["2311.01906", "2606.02780"]),
    "pre-ln+resformer": ("Identity-ResFormer", [SIMPLIFYING, VALUE_RESIDUAL], ["2311.01906", "2410.17897"]),
    "post-ln": ("Post-LN", ["Attention Is All You Need"], ["1706.03762"]),
}


@pytest.mark.parametrize("arch", CARDS)
def test_card_names_the_preset_and_its_paper(arch, tmp_path):
    folder = save_pretrained(model_of(arch, 64), tmp_path / "hf", format="hf")
    card = (folder / "README.md").read_text()
    title = next(line for line in card.splitlines() if line.startswith("# "))
    named, cited, arxiv = CARDS[arch]
    assert f"`{arch}`" in title and named in title
    assert all(paper in card for paper in cited)
    meta = front_matter(folder / "README.md")
    assert meta["license"] == "mit" and meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "text-generation"
    assert [t for t in meta["tags"] if t.startswith("arxiv:")] == [f"arxiv:{n}" for n in arxiv]
    assert {"blocklab", *arch.split("+"), "custom_code"} <= set(meta["tags"])


def test_sas_and_pre_ln_cards_differ():
    """The reported bug: both were titled "`pre-ln` blocks, `standard` value path"."""
    from blocklab.interop.model_card import model_card

    cards = {arch: model_card(model_of(arch, 64)) for arch in ("pre-ln", "sas", "shaped")}
    titles = {next(line for line in card.splitlines() if line.startswith("# ")) for card in cards.values()}
    assert len(titles) == 3


@pytest.mark.parametrize("block", BLOCK_PRESETS)
@pytest.mark.parametrize("value_path", ["standard", "resformer", "bov"])
def test_preset_is_found_from_the_fields(block, value_path):
    """Every block preset, with and without a value path, is named back from its ModelConfig alone."""
    arch = block if value_path == "standard" else f"{block}+{value_path}"
    found = architecture(ModelConfig.from_preset(arch, "tiny", **SMALL))
    assert (found.name, found.differs, found.recorded) == (arch, (), False)


def test_card_keeps_the_recorded_preset_and_names_changed_fields(tmp_path):
    """A run's config.yaml names the preset; a field changed from it is named, not hidden."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("arch: sas-p+svformer\nsize: tiny\nseed: 0\n")
    model = model_of("sas-p+svformer", 64, mlp_branch_gain=0.3)
    folder = save_pretrained(model, tmp_path / "hf", format="hf", run=run)
    card = (folder / "README.md").read_text()
    assert "Preset: `sas-p+svformer`, size preset `tiny` (as its training run recorded)" in card
    assert "except for `mlp_branch_gain`" in card
    unrecorded = architecture(model.cfg)
    assert (unrecorded.name, unrecorded.differs) == ("sas-p+svformer", ("mlp_branch_gain",))


def test_card_of_a_run_without_bits_per_byte(tmp_path):
    """summary.json's val_bpb is null for a masked LM or held-out tokens without text bytes: the card
    said `{None:.4f}`, a TypeError that stopped `blocklab export`."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"arch": "pre-ln", "size": "tiny", "seed": 0, "step": 2,
                                                  "tokens": 64, "val_loss": 3.25, "val_bpb": None}))
    folder = save_pretrained(model_of("pre-ln", 64), tmp_path / "hf", format="hf", run=run)
    assert "- validation loss 3.2500 nats/token, no bits/byte (none measured)" in \
        (folder / "README.md").read_text().splitlines()


# -- 4. native exports: card and generation_config.json --------------------------------------------
@pytest.mark.parametrize("target", ["gpt2", "llama"])
def test_native_export_has_a_card_and_generation_config(target, tokenizers, tmp_path):
    tok = tokenizers["byte"]
    model = model_of("pre-ln", tok.vocab_size, **(GPT2_LIKE if target == "gpt2" else LLAMA_LIKE))
    folder = save_pretrained(model, tmp_path / "hf", tokenizer=tok, format="hf")
    generation = transformers.GenerationConfig.from_pretrained(folder)
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (tok.eos_id,) * 3
    card = (folder / "README.md").read_text()
    meta = front_matter(folder / "README.md")
    assert meta["license"] == "mit" and meta["pipeline_tag"] == "text-generation"
    assert {"blocklab", "pre-ln", target} <= set(meta["tags"]) and "custom_code" not in meta["tags"]
    assert "Exported from blocklab" in card and "no blocklab installed" in card
    assert "trust_remote_code" not in card and "`pre-ln`" in card
    without_tokenizer = save_pretrained(model, tmp_path / "bare", format="hf")
    assert transformers.GenerationConfig.from_pretrained(without_tokenizer).eos_token_id is None
