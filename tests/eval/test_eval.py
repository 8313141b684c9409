"""Evaluation: continuation log-likelihoods and zero-shot multiple choice against hand computations
with stub models whose log-probabilities we control, CORE, a tiny trained run end to end (library
and CLI), and the lm-evaluation-harness adapter on local YAML tasks (skipped without lm_eval)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from blocklab import LanguageModel, ModelConfig
from blocklab.data import byte_tokenizer
from blocklab.eval import (
    MCExample,
    continuation_ids,
    core_score,
    evaluate_mc,
    load_mc,
    score_continuations,
    score_mc,
)
from blocklab.training import TrainConfig, load_run, train
from blocklab.util.errors import ConfigError

V = 258  # the byte tokenizer: 256 bytes, then the separator (256) and the mask token (257)


class BigramStub(nn.Module):
    """A causal 'model' whose logits at position t are table[token_t] + position_bias[t]."""

    def __init__(self, context_length: int = 64, seed: int = 0, position_bias: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = SimpleNamespace(causal=True, context_length=context_length, vocab_size=V)
        self.table = nn.Parameter(torch.randn(V, V, generator=g, dtype=torch.float64))
        bias = torch.randn(context_length, V, generator=g, dtype=torch.float64) if position_bias else None
        if bias is None:
            bias = torch.zeros(context_length, V, dtype=torch.float64)
        self.position_bias = nn.Parameter(bias)

    def forward(self, ids):
        return self.table[ids] + self.position_bias[: ids.shape[1]]


def bigram_logprob(stub: BigramStub, ids: list[int], n: int) -> float:
    """log p of the last n tokens of `ids`, read from the table one pair at a time (positions from 0)."""
    total = 0.0
    for t in range(len(ids) - n, len(ids)):
        logits = stub.table[ids[t - 1]] + stub.position_bias[t - 1]
        total += (logits[ids[t]] - torch.logsumexp(logits, 0)).item()
    return total


# -- log-likelihoods -----------------------------------------------------------------------------------
def test_continuation_scores_match_the_bigram_closed_form():
    stub = BigramStub(position_bias=True, context_length=12)
    g = random.Random(0)
    requests = [([g.randrange(256) for _ in range(g.randint(1, 9))],
                 [g.randrange(256) for _ in range(g.randint(1, 4))]) for _ in range(9)]
    requests.append((list(range(20)), [7, 8, 9]))  # longer than the context: the last 12 tokens are read
    out = score_continuations(stub, requests, batch_size=4)
    for (context, continuation), (score, greedy) in zip(requests, out, strict=True):
        ids = (context + continuation)[-13:]
        assert score == pytest.approx(bigram_logprob(stub, ids, len(continuation)), abs=1e-9)
        argmax = [int((stub.table[ids[t - 1]] + stub.position_bias[t - 1]).argmax())
                  for t in range(len(ids) - len(continuation), len(ids))]
        assert greedy == (argmax == ids[-len(continuation):])
    # a continuation made of the greedy tokens is greedy
    first = int(stub.table[5].argmax())
    assert score_continuations(stub, [([5], [first])])[0][1] is True


def test_scores_do_not_depend_on_batching_or_padding():
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("pre-ln+resformer", "tiny", d_model=32, n_layers=2, n_heads=2,
                                  vocab_size=V, context_length=16)
    model = LanguageModel(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = random.Random(1)
    requests = [([g.randrange(V) for _ in range(g.randint(1, 10))],
                 [g.randrange(V) for _ in range(g.randint(1, 5))]) for _ in range(7)]
    one = score_continuations(model, requests, batch_size=1)
    many = score_continuations(model, requests, batch_size=7)
    for (a, ga), (b, gb) in zip(one, many, strict=True):
        assert a == pytest.approx(b, abs=1e-10) and ga == gb
    # and each equals a direct log-softmax read of the model's logits
    context, continuation = requests[0]
    ids = torch.tensor([context + continuation])
    logp = F.log_softmax(model(ids[:, :-1]), -1)[0, -len(continuation):]
    assert one[0][0] == pytest.approx(logp.gather(-1, torch.tensor(continuation)[:, None]).sum().item())


def test_bad_requests_and_encoders_are_refused():
    stub = BigramStub(context_length=8)
    with pytest.raises(ValueError, match="at least one token"):
        score_continuations(stub, [([], [1])])
    with pytest.raises(ValueError, match="does not fit"):
        score_continuations(stub, [([1], list(range(9)))])
    encoder = LanguageModel(ModelConfig.from_preset("pre-ln", "tiny", d_model=32, n_layers=1, n_heads=2,
                                                  vocab_size=V, context_length=8, causal=False))
    with pytest.raises(ConfigError, match="causal"):
        score_continuations(encoder, [([1], [2])])


# -- multiple choice -------------------------------------------------------------------------------------
def test_uniform_model_by_hand():
    """Uniform logits: log p = -n log V for n tokens. Summed scoring picks the shortest choice;
    per byte every choice ties at -log V and the first one wins."""
    stub = BigramStub()
    with torch.no_grad():
        stub.table.zero_()
    tok = byte_tokenizer()
    examples = [MCExample("ctx", ["a", "bbb", "cc"], 0),      # shortest = 0, first = 0
                MCExample("ctx", ["dddd", "e"], 1),           # shortest = 1, first = 0
                MCExample("ctx", ["ff", "g", "hhh", "ii"], 2)]  # shortest = 1, first = 0
    result = score_mc(stub, tok, examples, "uniform")
    assert result.acc == pytest.approx(2 / 3) and result.acc_per_byte == pytest.approx(1 / 3)
    r = (1 / 3 + 1 / 2 + 1 / 4) / 3
    assert result.random_baseline == pytest.approx(r)
    assert result.centered_acc == pytest.approx((2 / 3 - r) / (1 - r))
    assert result.centered_acc_per_byte == pytest.approx((1 / 3 - r) / (1 - r))


def test_multiple_choice_matches_a_bigram_reference():
    stub = BigramStub(seed=3)
    tok = byte_tokenizer()
    g = random.Random(2)
    letters = "abcdefgh "
    examples = [MCExample("".join(g.choice(letters) for _ in range(g.randint(0, 8))),
                          ["".join(g.choice(letters) for _ in range(g.randint(1, 6))) for _ in range(4)],
                          g.randrange(4)) for _ in range(30)]
    result = score_mc(stub, tok, examples, "bigram", batch_size=8)
    hits_sum = hits_byte = 0
    for e in examples:
        scores = []
        for choice in e.choices:
            ids = [256] + list((e.context + " " + choice).encode())
            scores.append(bigram_logprob(stub, ids, len(choice) + 1))  # the space is scored too
        per_byte = [s / (len(c) + 1) for s, c in zip(scores, e.choices, strict=True)]
        hits_sum += max(range(4), key=scores.__getitem__) == e.label
        hits_byte += max(range(4), key=per_byte.__getitem__) == e.label
    assert result.n == 30 and result.acc == hits_sum / 30 and result.acc_per_byte == hits_byte / 30
    assert result.centered_acc == pytest.approx((hits_sum / 30 - 0.25) / 0.75)
    assert result.acc != result.acc_per_byte  # the two scorings disagree somewhere on this data


def test_core_is_the_mean_centered_accuracy():
    stub = BigramStub()
    tok = byte_tokenizer()
    a = score_mc(stub, tok, [MCExample("x", ["y", "zz"], 0)] * 2, "a")
    b = score_mc(stub, tok, [MCExample("x", ["y", "zz", "w"], 1)] * 3, "b")
    core = core_score([a, b])
    assert core["core"] == pytest.approx((a.centered_acc + b.centered_acc) / 2)
    assert core["core_per_byte"] == pytest.approx((a.centered_acc_per_byte + b.centered_acc_per_byte) / 2)


UNIFORM_EXAMPLES = [MCExample("ctx", ["a", "bbb", "cc"], 0), MCExample("ctx", ["dddd", "e"], 1),
                    MCExample("ctx", ["ff", "g", "hhh", "ii"], 2)]  # uniform model: acc 2/3, per byte 1/3


def _write_mc(path: Path, examples: list[MCExample]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e.__dict__) + "\n" for e in examples))
    return path


def test_per_task_random_baseline_and_task_names_by_hand(tmp_path):
    stub = BigramStub()
    with torch.no_grad():
        stub.table.zero_()
    tok = byte_tokenizer()
    result = score_mc(stub, tok, UNIFORM_EXAMPLES, "u", random_baseline=0.5)
    assert result.random_baseline == 0.5
    assert result.centered_acc == pytest.approx((2 / 3 - 0.5) / 0.5)  # 1/3
    assert result.centered_acc_per_byte == pytest.approx((1 / 3 - 0.5) / 0.5)  # -1/3
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        score_mc(stub, tok, UNIFORM_EXAMPLES, "u", random_baseline=1.0)

    # two files named t.jsonl become tasks a/t and b/t; b/t: "a" is shortest but wrong, per byte ties -> 0
    a = _write_mc(tmp_path / "a" / "t.jsonl", UNIFORM_EXAMPLES)
    b = _write_mc(tmp_path / "b" / "t.jsonl", [MCExample("ctx", ["a", "bbb"], 1)])
    report = evaluate_mc(stub, tok, [a, b], random_baseline={"a/t": 0.5})
    assert [t["task"] for t in report["tasks"]] == ["a/t", "b/t"]
    assert [t["random_baseline"] for t in report["tasks"]] == [0.5, 0.5]
    assert [t["centered_acc"] for t in report["tasks"]] == pytest.approx([1 / 3, -1.0])
    assert report["core"] == pytest.approx((1 / 3 - 1.0) / 2)
    assert report["core_per_byte"] == pytest.approx((-1 / 3 - 1.0) / 2)
    with pytest.raises(ConfigError, match="'t'.*the tasks are 'a/t', 'b/t'"):
        evaluate_mc(stub, tok, [a, b], random_baseline={"t": 0.3})
    with pytest.raises(ConfigError, match="distinct name"):  # the same file twice
        evaluate_mc(stub, tok, [a, a])


def test_continuation_split_where_the_encodings_part():
    tok = byte_tokenizer()
    context, continuation = continuation_ids(tok, "ab", " cd")
    assert context == [256, 97, 98] and continuation == [32, 99, 100]


@pytest.mark.parametrize("line, words", [
    ('{"context": "a", "choices": ["b"], "label": 0}', ["at least two"]),
    ('{"context": "a", "choices": ["b", "c"], "label": 2}', ["'label' = 2", "[0, 2)"]),
    ('{"context": "a", "choices": ["b", "c"]}', ["'context', 'choices' and 'label'"]),
    ("not json", ["line 1 is not JSON"]),
])
def test_bad_multiple_choice_files(tmp_path, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError) as err:
        load_mc(path)
    for word in words:
        assert word in str(err.value)


# -- a tiny trained run, end to end ---------------------------------------------------------------------
WORDS = ["def", "return", "self", "value", "import", "class", "for", "in", "range", "if", "else"]


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clm")
    corpus = root / "corpus"
    corpus.mkdir()
    g = random.Random(0)
    for i in range(20):
        lines = (" ".join(g.choice(WORDS) for _ in range(8)) for _ in range(40))
        (corpus / f"f{i}.py").write_text("\n".join(lines))
    cfg = TrainConfig.from_dict(dict(
        arch="pre-ln", size="tiny", model={"d_model": 32, "n_layers": 2, "n_heads": 2}, batch_size=8,
        seq_len=32, max_steps=30, eval_every=0, eval_batches=1, ckpt_every=0, progress=False,
        out_dir=str(root / "run"), optim={"lr": 3e-3, "warmup_fraction": 0.0},
        data={"source": str(corpus), "tokenizer": "byte", "cache_dir": str(root / "cache"),
              "val_fraction": 0.2}))
    train(cfg)
    return root / "run"


def _mc_files(root: Path) -> list[Path]:
    """Task 'words': the in-corpus continuation against byte junk (2 choices); 'junk3': 3 choices."""
    g = random.Random(1)
    files = []
    root.mkdir(parents=True, exist_ok=True)
    for name, k in (("words", 2), ("junk3", 3)):
        rows = []
        for _ in range(12):
            good = " ".join(g.choice(WORDS) for _ in range(2))
            junk = ["".join(chr(g.randrange(0x21, 0x7f)) for _ in range(len(good))) for _ in range(k - 1)]
            label = g.randrange(k)
            rows.append({"context": " ".join(g.choice(WORDS) for _ in range(3)),
                         "choices": junk[:label] + [good] + junk[label:], "label": label})
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files.append(path)
    return files


def test_trained_run_prefers_its_own_text_and_cli_writes_the_report(clm_run, tmp_path, capsys):
    from blocklab.cli import main

    files = _mc_files(tmp_path)
    run = load_run(clm_run)
    report = evaluate_mc(run.model, run.tokenizer, files)
    for task in report["tasks"]:  # 30 steps of training already separate its words from byte junk
        assert task["acc"] >= 0.9 and task["acc_per_byte"] >= 0.9, task
    assert report["core"] == pytest.approx(sum(t["centered_acc"] for t in report["tasks"]) / 2)

    out = tmp_path / "eval.json"
    assert main(["eval", "--run", str(clm_run), "--mc", ",".join(map(str, files)), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "CORE" in printed and "junk3" in printed
    saved = json.loads(out.read_text())["multiple_choice"]
    assert len(saved["tasks"]) == len(report["tasks"])
    for got, want in zip(saved["tasks"], report["tasks"], strict=True):  # approx takes no list of dicts
        assert got == pytest.approx(want)
    assert saved["core"] == pytest.approx(report["core"])
    # --baseline sets r per task; same-stem files in two folders are told apart by their folder
    twins = [_mc_files(tmp_path / d)[0] for d in ("x", "y")]
    assert main(["eval", "--run", str(clm_run), "--mc", ",".join(map(str, twins)),
                 "--baseline", "x/words=0.2", "--out", str(out)]) == 0
    tasks = json.loads(out.read_text())["multiple_choice"]["tasks"]
    assert [t["task"] for t in tasks] == ["x/words", "y/words"]
    assert tasks[0]["centered_acc"] == pytest.approx((tasks[0]["acc"] - 0.2) / 0.8)
    assert tasks[1]["centered_acc"] == pytest.approx((tasks[1]["acc"] - 0.5) / 0.5)
    assert main(["eval", "--run", str(clm_run), "--mc", str(files[0]), "--baseline", "words"]) == 2
    assert "TASK=R" in capsys.readouterr().err
    assert main(["eval", "--run", str(clm_run)]) == 2  # nothing to evaluate
    assert main(["eval", "--run", str(tmp_path), "--mc", str(files[0])]) == 2  # not a run directory
    assert "not a blocklab run" in capsys.readouterr().err


# -- lm-evaluation-harness adapter ----------------------------------------------------------------------
def _harness_lm(context_length: int = 16):
    pytest.importorskip("lm_eval")
    from blocklab.eval.harness import BlocklabLM

    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("sas", "tiny", d_model=32, n_layers=2, n_heads=2, vocab_size=V,
                                  context_length=context_length)
    model = LanguageModel(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return BlocklabLM(model, byte_tokenizer(), batch_size=4), model


def test_harness_batch_size_must_be_an_integer():
    pytest.importorskip("lm_eval")
    from blocklab.eval.harness import BlocklabLM

    stub = BigramStub()
    assert BlocklabLM(stub, byte_tokenizer(), batch_size="8").batch_size == 8  # model_args give strings
    for bad in ("auto", "auto:4", 0):
        with pytest.raises(ConfigError, match="'auto' batch-size search is not supported"):
            BlocklabLM(stub, byte_tokenizer(), batch_size=bad)


def _direct_logprob(model, ids: list[int], n: int) -> float:
    logp = F.log_softmax(model(torch.tensor([ids[:-1]])), -1)[0, -n:]
    return logp.gather(-1, torch.tensor(ids[-n:])[:, None]).sum().item()


def test_harness_loglikelihood_and_rolling_windows():
    from lm_eval.api.instance import Instance

    lm, model = _harness_lm()
    pairs = [("def value", " return"), ("", "self"), ("x", " in range")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    for (context, continuation), (score, _) in zip(pairs, lm.loglikelihood(requests), strict=True):
        ids = [256] if not context else list(context.encode())  # an empty context reads the separator
        ids += list(continuation.encode())
        assert score == pytest.approx(_direct_logprob(model, ids, len(continuation.encode())), abs=1e-9)

    # rolling: a text of 40 bytes in disjoint windows of 16 predictions, [SEP] before the first one
    text = "import self for value in range if else!!"
    tokens = list(text.encode())
    expected = _direct_logprob(model, [256] + tokens[:16], 16)
    for end, n in ((32, 16), (40, 8)):  # later windows read the 16 tokens before their last prediction
        expected += _direct_logprob(model, tokens[end - 17:end], n)
    rolled = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert rolled[0] == pytest.approx(expected, abs=1e-9)


def test_harness_generate_until_is_greedy_and_stops():
    from lm_eval.api.instance import Instance

    lm, model = _harness_lm()
    ids = [256] + list(b"def ")
    for _ in range(6):  # a plain greedy reference, no cache
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    reference = lm.tok_decode(ids[5:]).split(lm.tok_decode([256]))[0]
    out = lm.generate_until([Instance("generate_until", {}, ("def ", {"until": [], "max_gen_toks": 6}), 0)])
    assert out == [reference]
    assert len(reference) > 2
    stop = reference[2]
    request = Instance("generate_until", {}, ("def ", {"until": [stop], "max_gen_toks": 6}), 0)
    cut = lm.generate_until([request])
    assert cut == [reference.split(stop)[0]]


def test_harness_generation_without_a_cache_follows_the_bigram_argmax():
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from blocklab.eval.harness import BlocklabLM

    stub = BigramStub(seed=5)  # no `generate`: the adapter's plain greedy loop
    with torch.no_grad():
        stub.table[:, 256:] = -1e9  # never the separator or the mask token
    lm = BlocklabLM(stub, byte_tokenizer())
    tokens, last = [], ord("x")
    for _ in range(5):
        last = int(stub.table[last].argmax())
        tokens.append(last)
    out = lm.generate_until([Instance("generate_until", {}, ("x", {"max_gen_toks": 5}), 0)])
    assert out == [lm.tok_decode(tokens)]


def _write_tasks(root: Path, mc: list[dict], texts: list[dict]) -> Path:
    """A multiple-choice and a rolling-likelihood harness task over local JSONL files."""
    (root / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mc))
    (root / "ppl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in texts))
    tasks = root / "tasks"
    tasks.mkdir()
    common = "dataset_path: json\ntest_split: test\nmetadata:\n  version: 0\n"
    (tasks / "toy_mc.yaml").write_text(
        f"task: toy_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        f"  cache_dir: {root / 'hf'}\noutput_type: multiple_choice\ndoc_to_text: '{{{{context}}}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n")
    (tasks / "toy_ppl.yaml").write_text(
        f"task: toy_ppl\n{common}dataset_kwargs:\n  data_files:\n    test: {root / 'ppl.jsonl'}\n"
        f"  cache_dir: {root / 'hf'}\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: bits_per_byte\n")
    return tasks


MC = [{"context": "def value", "choices": ["return self", "import", "in range x"], "label": i % 3}
      for i in range(6)]
TEXTS = [{"text": "for value in range"}, {"text": "class self import if else"}]  # < 32 bytes each


def _reference_bits_per_byte(model) -> float:
    total_ll = sum(_direct_logprob(model, [256] + list(r["text"].encode()), len(r["text"])) for r in TEXTS)
    return -total_ll / sum(len(r["text"]) for r in TEXTS) / math.log(2)


def test_harness_runs_local_yaml_tasks(tmp_path):
    lm, model = _harness_lm(context_length=32)
    from blocklab.eval.harness import run_harness

    tasks = _write_tasks(tmp_path, MC, TEXTS)
    results = run_harness(lm, ["toy_mc", "toy_ppl"], include_path=tasks, include_defaults=False,
                          bootstrap_iters=0)["results"]
    hits = 0
    for row in MC:  # the harness scores ' ' + choice after the context, without a separator in front
        scores = [_direct_logprob(model, list((row["context"] + " " + c).encode()), len(c) + 1)
                  for c in row["choices"]]
        hits += max(range(3), key=scores.__getitem__) == row["label"]
    assert results["toy_mc"]["acc,none"] == pytest.approx(hits / len(MC))
    assert results["toy_ppl"]["bits_per_byte,none"] == pytest.approx(_reference_bits_per_byte(model))


def test_cli_runs_harness_tasks_on_a_trained_run(clm_run, tmp_path, capsys):
    pytest.importorskip("lm_eval")
    from blocklab.cli import main

    tasks = _write_tasks(tmp_path, MC, TEXTS)
    out = tmp_path / "eval.json"
    assert main(["eval", "--run", str(clm_run), "--tasks", "toy_mc,toy_ppl", "--include-path", str(tasks),
                 "--local-only", "--bootstrap-iters", "0", "--out", str(out)]) == 0
    assert "toy_ppl" in capsys.readouterr().out
    results = json.loads(out.read_text())["harness"]["results"]
    bpb = results["toy_ppl"]["bits_per_byte,none"]
    assert bpb == pytest.approx(_reference_bits_per_byte(load_run(clm_run).model), rel=1e-5)
    assert bpb < 6.0  # trained on these words; a uniform guess over the bytes would cost 8 bits
