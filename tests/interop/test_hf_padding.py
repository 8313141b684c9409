"""Padded batches through the Hugging Face model (interop/hf_model.py): HF `generate` on prompts of
different lengths, padded on the left (or the right), gives every row the tokens of its prompt
generated alone, and lm-evaluation-harness's `hf` backend answers a `generate_until` task at batch size
4 as at batch size 1. The references are the same model on each prompt alone, unpadded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from blocklab import LanguageModel  # noqa: E402
from blocklab.data.tokenizer import train_bpe  # noqa: E402
from blocklab.interop import save_pretrained  # noqa: E402
from blocklab.interop.hf_model import hf_model  # noqa: E402
from tests.interop.test_hf_model import perturbed as _perturbed  # noqa: E402


def perturbed(arch: str, **fields) -> LanguageModel:
    """A tiny model with every parameter moved well off its initialisation (noise of std 0.3)."""
    return _perturbed(arch, scale=0.3, **fields)

DONE_WHEN = ("pre-ln", "sas-p", "svformer", "bov", "cla")
NEW = 8
# float32: a masked SDPA call and the unmasked causal kernel round differently (logits of size ~10)
F32 = dict(rtol=1e-4, atol=1e-4)


def _padded(prompts: list[list[int]], side: str, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    t = max(map(len, prompts))
    ids = torch.full((len(prompts), t), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        where = slice(t - len(p), t) if side == "left" else slice(0, len(p))
        ids[row, where], mask[row, where] = torch.tensor(p), 1
    return ids, mask


def _greedy(hf, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch", DONE_WHEN)
def test_hf_generate_on_a_padded_batch_gives_each_prompt_its_tokens_alone(arch, side):
    model = perturbed(arch)
    hf = hf_model(model).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, model.cfg.vocab_size, (n,), generator=gen).tolist() for n in (11, 4)]
    ids, mask = _padded(prompts, side)
    out = _greedy(hf, ids, mask)
    assert torch.equal(out[:, :ids.shape[1]], ids)
    for row, prompt in enumerate(prompts):
        alone = _greedy(hf, torch.tensor([prompt]))
        assert torch.equal(out[row, ids.shape[1]:], alone[0, len(prompt):]), (row, out[row], alone[0])
    ours = model.generate(ids, NEW, attention_mask=mask)  # blocklab's own generate, the same batch
    assert torch.equal(ours, out)
    # every real position's logits in a padded forward pass equal the prompt's alone
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask).logits
        for row, prompt in enumerate(prompts):
            torch.testing.assert_close(logits[row][mask[row].bool()], model(torch.tensor([prompt]))[0], **F32)


def test_a_padded_encoder_batch_scores_each_sequence_as_alone():
    model = perturbed("pre-ln", causal=False)
    hf = hf_model(model).eval()
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    ids, mask = _padded(prompts, "right")
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask).logits
        for row, prompt in enumerate(prompts):
            torch.testing.assert_close(logits[row][mask[row].bool()], model(torch.tensor([prompt]))[0], **F32)


def _write_generation_task(root: Path, questions: list[str]) -> Path:
    (root / "gen.jsonl").write_text("".join(json.dumps({"question": q, "answer": "x"}) + "\n"
                                            for q in questions))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "toy_gen.yaml").write_text(
        "task: toy_gen\ndataset_path: json\ntest_split: test\nmetadata:\n  version: 0\n"
        f"dataset_kwargs:\n  data_files:\n    test: {root / 'gen.jsonl'}\n  cache_dir: {root / 'hf'}\n"
        "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['@@@']\n  max_gen_toks: 12\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    return tasks


def test_lm_eval_generate_until_at_batch_size_4_answers_as_at_batch_size_1(tmp_path):
    """lm-evaluation-harness's own `hf` model on a local generate_until task whose prompts differ in
    length: the answers of batches of 4 (left-padded by the harness) equal those of batches of 1."""
    pytest.importorskip("lm_eval")
    from lm_eval import simple_evaluate
    from lm_eval.models import huggingface  # noqa: F401 (registers "hf")
    from lm_eval.tasks import TaskManager

    text = ["def value(self):\n    return self.value + 1\n", "for i in range(10):\n    print(i)\n"] * 20
    tokenizer = train_bpe(text, vocab_size=320)
    model = perturbed("sas-p", value_path="svformer", vocab_size=tokenizer.vocab_size)
    folder = save_pretrained(model, tmp_path / "export",
                             tokenizer=tokenizer.hf, format="hf")
    questions = ["def value(self):", "for i in", "class Point:\n    x = 0\n    y =", "print(", "return self",
                 "for i in range(10):\n    print(i)\n    if i:"]
    tasks = _write_generation_task(tmp_path, questions)
    answers = {}
    for batch in (1, 4):
        out = simple_evaluate(
            model="hf", model_args={"pretrained": str(folder), "trust_remote_code": True, "dtype": "float32",
                                     "device": "cpu"},
            tasks=["toy_gen"], task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
            bootstrap_iters=0, batch_size=batch, log_samples=True)
        samples = sorted(out["samples"]["toy_gen"], key=lambda s: s["doc_id"])
        answers[batch] = [s["resps"][0][0] for s in samples]
    assert len(answers[1]) == len(questions)
    assert any(answers[1])  # the model does answer something
    assert answers[4] == answers[1]


def _readme_hf_example() -> str:
    """The Python block of README.md's "Export for Hugging Face" section, as written."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Export for Hugging Face", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("kind", ["sas-p", "gpt2-like", "llama-like"])
def test_readme_hf_example_gives_each_prompt_its_tokens_alone(kind, tmp_path, monkeypatch):
    """README.md's Hugging Face example, run as written (a remote-code export and the two native ones):
    the tokenizer gives ids and mask only, no token_type_ids (which transformers 4.x's `generate`
    refused for remote code and Llama, and GPT-2 added to its embeddings), and each row of the padded
    batch is what the same HF model generates from that prompt alone, unpadded."""
    from types import SimpleNamespace

    import blocklab.interop
    from tests.interop.test_hf import GPT2_LIKE, LLAMA_LIKE

    fields = {"sas-p": {}, "gpt2-like": GPT2_LIKE, "llama-like": LLAMA_LIKE}[kind]
    model = perturbed("sas-p" if kind == "sas-p" else "pre-ln", **{**fields, "vocab_size": 320})
    tokenizer = train_bpe(["def f(x):\n    return x + 1\n", "import os\nimport sys\n"] * 30, vocab_size=320)
    (tmp_path / "runs" / "sas-p").mkdir(parents=True)
    tokenizer.hf.save(str(tmp_path / "runs" / "sas-p" / "tokenizer.json"))
    monkeypatch.chdir(tmp_path)
    example = _readme_hf_example()
    assert 'tok(["def f(x):", "import"], padding=True, return_tensors="pt")' in example
    scope = {"blocklab": blocklab, "run": SimpleNamespace(model=model)}
    exec(compile(example, "README.md", "exec"), scope)  # noqa: S102 (the README's own code)
    hf, tok, batch, out = scope["hf"], scope["tok"], scope["batch"], scope["out"]
    native = json.loads((tmp_path / "hf" / "sas-p" / "config.json").read_text())["model_type"]
    assert native == {"sas-p": "blocklab", "gpt2-like": "gpt2", "llama-like": "llama"}[kind]
    assert sorted(batch) == ["attention_mask", "input_ids"]
    assert batch["attention_mask"].sum(1).tolist() != [batch["input_ids"].shape[1]] * 2  # padded
    width = batch["input_ids"].shape[1]
    for row, prompt in enumerate(["def f(x):", "import"]):
        alone = tok([prompt], return_tensors="pt")
        with torch.no_grad():
            want = hf.generate(**alone, max_new_tokens=20)[0]
        start = width - alone["input_ids"].shape[1]
        assert torch.equal(batch["input_ids"][row, start:], alone["input_ids"][0])
        assert torch.equal(out[row, start:start + len(want)], want), (kind, prompt)
        assert (out[row, start + len(want):] == tok.pad_token_id).all()  # only after an early eos
