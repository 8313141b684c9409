"""Fine-tuning: GLUE metrics against hand computations, task files, the input layout, the head,
and a tiny masked-LM run fine-tuned on a synthetic keyword task (library and CLI)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from blocklab import LanguageModel, ModelConfig
from blocklab.data import byte_tokenizer
from blocklab.finetune import metrics as M
from blocklab.finetune.loop import FinetuneConfig, finetune, prepare_encoder
from blocklab.finetune.model import SequenceClassifier, encode_example, final_hidden_states, pool
from blocklab.finetune.tasks import compute_metrics, load_task_file, make_task, resolve_labels
from blocklab.training import TrainConfig, train
from blocklab.util.errors import ConfigError

WORDS = ["the", "film", "was", "plot", "scene", "story", "and", "a", "end"]


# -- metrics ------------------------------------------------------------------------------------------
def test_binary_metrics_match_a_hand_computed_2x2_table():
    # TP = 3, FN = 2, FP = 1, TN = 4
    labels = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    preds = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
    assert M.accuracy(preds, labels) == pytest.approx(7 / 10)
    assert M.f1_binary(preds, labels) == pytest.approx(2 * 3 / (2 * 3 + 1 + 2))
    mcc = (3 * 4 - 1 * 2) / math.sqrt((3 + 1) * (3 + 2) * (4 + 1) * (4 + 2))
    assert M.matthews_corrcoef(preds, labels) == pytest.approx(mcc)  # 10 / sqrt(600) = 0.4082
    assert M.matthews_corrcoef([1 - p for p in preds], labels) == pytest.approx(-mcc)  # flipped predictions


def test_degenerate_predictions_give_zero_not_nan():
    labels = [0, 1, 0, 1]
    assert M.matthews_corrcoef([0, 0, 0, 0], labels) == 0.0
    assert M.f1_binary([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0
    assert M.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == 0.0
    with pytest.raises(ValueError, match="equal length"):
        M.accuracy([0, 1], [0])


def test_multiclass_mcc_is_the_correlation_of_one_hot_codes():
    # Gorodkin (2004): MCC = sum_k cov(X_k, Y_k) / sqrt(sum_k cov(X_k, X_k) sum_k cov(Y_k, Y_k))
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 40)
    preds = np.where(rng.random(40) < 0.6, labels, rng.integers(0, 3, 40))
    x, y = np.eye(3)[preds], np.eye(3)[labels]
    x, y = x - x.mean(0), y - y.mean(0)
    expected = (x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum())
    assert M.matthews_corrcoef(preds.tolist(), labels.tolist()) == pytest.approx(expected)


def test_pearson_and_spearman_with_ties_by_hand():
    # x = 1, 2, 3, 4 and y = 2, 4, 5, 4: sum dx dy = 3.5, sum dx^2 = 5, sum dy^2 = 4.75
    assert M.pearson([1, 2, 3, 4], [2, 4, 5, 4]) == pytest.approx(3.5 / math.sqrt(5 * 4.75))
    # ties share the mean rank: 10, 20, 20, 20, 5 -> 2, 4, 4, 4, 1
    assert M.average_ranks([10, 20, 20, 20, 5]).tolist() == [2, 4, 4, 4, 1]
    # ranks of x = 1, 2, 2, 3 are 1, 2.5, 2.5, 4; y = 1, 3, 2, 4: rho = 4.5 / sqrt(4.5 * 5)
    assert M.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert M.spearman([1, 2, 3, 4], [1, 8, 27, 64]) == pytest.approx(1.0)  # monotone, not linear
    assert M.pearson([1, 2, 3, 4], [1, 8, 27, 64]) < 0.99


def test_spearman_matches_scipy_on_data_with_many_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 5, 60).astype(float), rng.integers(0, 4, 60).astype(float)
    assert M.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


def test_task_metrics_and_glue_scores():
    mrpc = compute_metrics(make_task("mrpc"), [1, 1, 0, 0], [1, 0, 0, 0])
    assert mrpc["f1"] == pytest.approx(2 / 3) and mrpc["accuracy"] == 0.75
    assert mrpc["score"] == pytest.approx((2 / 3 + 0.75) / 2)  # GLUE averages MRPC's two metrics
    cola = compute_metrics(make_task("cola"), [1, 0, 1, 0], [1, 0, 0, 0])
    assert cola["score"] == cola["mcc"] == pytest.approx(1 / math.sqrt(3))
    stsb = compute_metrics(make_task("stsb"), [0.1, 0.4, 0.2], [1.0, 3.0, 2.0])
    assert stsb["spearman"] == pytest.approx(1.0) and stsb["score"] == pytest.approx(
        (stsb["pearson"] + 1.0) / 2)


# -- task files ---------------------------------------------------------------------------------------
def test_glue_tsv_and_jsonl_layouts(tmp_path):
    mrpc = tmp_path / "mrpc.tsv"  # the original GLUE layout, with a stray quote in a sentence
    mrpc.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                    '1\t11\t12\tHe said "yes\tHe agreed\n0\t13\t14\tA cat\tA dog\n')
    examples = load_task_file(mrpc, make_task("mrpc"))
    assert [(e.texts, e.label) for e in examples] == [(('He said "yes', "He agreed"), 1),
                                                      (("A cat", "A dog"), 0)]
    mnli = tmp_path / "mnli.jsonl"  # string labels map to the ids of the Hugging Face glue data set
    mnli.write_text("\n".join(json.dumps({"premise": "p", "hypothesis": "h", "label": lab})
                              for lab in ("contradiction", "entailment", "neutral", 2)))
    assert [e.label for e in load_task_file(mnli, make_task("mnli"))] == [2, 0, 1, 2]
    stsb = tmp_path / "stsb.tsv"
    stsb.write_text("index\tsentence1\tsentence2\tscore\n0\ta\tb\t3.8\n")
    assert load_task_file(stsb, make_task("stsb"))[0].label == pytest.approx(3.8)


def test_headerless_cola_and_a_bom(tmp_path):
    cola = tmp_path / "in_domain_train.tsv"  # GLUE's CoLA: source, label, original mark, sentence
    cola.write_text("gj04\t1\t\tOur friends won't buy this analysis, let alone the next one.\n"
                    'gj04\t0\t*\tThey drank the pub "dry.\n\n'
                    "cj99\t1\t\tThe more you eat, the less you want.\n")
    examples = load_task_file(cola, make_task("cola"))
    assert [(e.texts, e.label) for e in examples] == [
        (("Our friends won't buy this analysis, let alone the next one.",), 1),
        (('They drank the pub "dry.',), 0), (("The more you eat, the less you want.",), 1)]
    headed = tmp_path / "cola.tsv"  # a header line naming the columns still wins
    headed.write_text("label\tsentence\n0\tgj04\n")
    assert [(e.texts, e.label) for e in load_task_file(headed, make_task("cola"))] == [(("gj04",), 0)]
    short = tmp_path / "short.tsv"
    short.write_text("gj04\t1\n")
    with pytest.raises(ConfigError, match="row 1 has 2 columns"):
        load_task_file(short, make_task("cola"))
    with pytest.raises(ConfigError, match="no sentence column 'text'"):  # named columns: a header is needed
        load_task_file(cola, make_task("cola", text_columns=["text"]))

    mrpc = tmp_path / "msr_paraphrase_train.txt"  # GLUE's MRPC file starts with a UTF-8 BOM
    mrpc.write_bytes(b"\xef\xbb\xbfQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b\tA c\n")
    examples = load_task_file(mrpc, make_task("mrpc"))
    assert [(e.texts, e.label) for e in examples] == [(("A b", "A c"), 1)]


def test_generic_task_infers_its_labels(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text("text,sentiment\nnice,pos\nawful,neg\n")
    spec = make_task("generic", text_columns=["text"], label_column="sentiment")
    spec = resolve_labels(spec, ["pos", "neg"])
    assert spec.num_labels == 2 and spec.label_names == ("neg", "pos")
    assert spec.metrics == ("accuracy", "f1", "mcc")
    assert [e.label for e in load_task_file(path, spec)] == [1, 0]
    regression = make_task("generic", text_columns=["a", "b"], label_column="y", num_labels=1)
    assert regression.regression and regression.metrics == ("pearson", "spearman")


@pytest.mark.parametrize("call, words", [
    (lambda p: make_task("glue"), ["'glue'", "sst2", "generic"]),
    (lambda p: make_task("generic", text_columns=["a"]), ["label_column"]),
    (lambda p: make_task("rte", text_columns=["a"]), ["2 sentence column"]),
    (lambda p: make_task("sst2", num_labels=3), ["num_labels", "generic"]),
    (lambda p: load_task_file(p("sentence\tlabel\nhi\tmaybe\n"), make_task("sst2")), ["'maybe'", "[0, 2)"]),
    (lambda p: load_task_file(p("sentence\tlabel\nhi\t5\n"), make_task("sst2")), ["'5'", "[0, 2)"]),
    (lambda p: load_task_file(p("text\tlabel\nhi\t1\n"), make_task("sst2")), ["'sentence'", "'text'"]),
    (lambda p: load_task_file(p("premise\thypothesis\tlabel\na\tb\tyes\n"), make_task("mnli")),
     ["'yes'", "'entailment'"]),
    (lambda p: load_task_file(p("sentence1\tsentence2\tlabel\na\tb\thigh\n"), make_task("stsb")),
     ["'high'", "regression"]),
    (lambda p: FinetuneConfig(pooling="max"), ["pooling", "first, mean, last"]),
    (lambda p: FinetuneConfig(dropout=1.5), ["dropout", "[0, 1)"]),
    (lambda p: FinetuneConfig(lr=-1.0), ["lr"]),
    (lambda p: FinetuneConfig.from_dict({"epoch": 3}), ["'epoch'", "epochs"]),
])
def test_bad_input_names_what_is_wrong(tmp_path, call, words):
    def write(text: str) -> Path:
        path = tmp_path / "t.tsv"
        path.write_text(text)
        return path

    with pytest.raises(ConfigError) as err:
        call(write)
    for word in words:
        assert word in str(err.value)


# -- input layout and head ----------------------------------------------------------------------------
def test_input_layout_truncation_and_padding():
    tok = byte_tokenizer()
    sep = tok.eos_id
    ids, n = encode_example(tok, ("ab", "cde"), 10)
    assert ids == [sep, 97, 98, sep, 99, 100, 101, sep, sep, sep] and n == 8
    # longest first: 11 tokens of room after 3 separators; the shorter (3) keeps all, the longer 8
    ids, n = encode_example(tok, ("abc", "0123456789"), 14)
    assert tok.decode(ids[1:4]) == "abc" and tok.decode(ids[5:13]) == "01234567" and n == 14
    ids, n = encode_example(tok, ("0123456789", "abcdefgh"), 10)  # 7 of room: the shorter keeps 7 // 2
    assert tok.decode(ids[1:5]) == "0123" and tok.decode(ids[6:9]) == "abc" and n == 10


def test_pooling_by_hand():
    h = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)
    lengths = torch.tensor([2, 3])
    torch.testing.assert_close(pool(h, lengths, "first"), h[:, 0])
    torch.testing.assert_close(pool(h, lengths, "last"), torch.stack([h[0, 1], h[1, 2]]))
    torch.testing.assert_close(pool(h, lengths, "mean"), torch.stack([(h[0, 0] + h[0, 1]) / 2, h[1].mean(0)]))


def _encoder(**overrides) -> LanguageModel:
    torch.manual_seed(0)
    fields = {"d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 64, "context_length": 16,
              "causal": False, **overrides}
    cfg = ModelConfig.from_preset("sas-p", "tiny", **fields)
    model = LanguageModel(cfg)
    with torch.no_grad():  # away from initialisation: SAS-P is close to the identity there
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def test_final_hidden_states_are_what_the_tied_head_reads():
    model = _encoder()
    ids = torch.randint(0, 64, (2, 16))
    hidden = final_hidden_states(model, ids)
    torch.testing.assert_close(hidden @ model.tok_emb.weight.T, model(ids))

    class NoHiddenStates(nn.Module):  # a model without `hidden_states`: the final-norm hook path
        def __init__(self, inner):
            super().__init__()
            self.inner, self.norm = inner, inner.norm

        def forward(self, input_ids):
            return self.inner(input_ids)

    torch.testing.assert_close(final_hidden_states(NoHiddenStates(model), ids), hidden)


def test_classifier_head_by_hand_and_causal_first_token_refused():
    model = SequenceClassifier(_encoder(), num_labels=3, pooling="mean", dropout=0.0).eval()
    ids, lengths = torch.randint(0, 64, (2, 16)), torch.tensor([5, 16])
    h = final_hidden_states(model.encoder, ids)
    pooled = torch.stack([h[0, :5].mean(0), h[1].mean(0)])
    hidden = torch.tanh(pooled @ model.dense.weight.T + model.dense.bias)
    expected = hidden @ model.out.weight.T + model.out.bias
    torch.testing.assert_close(model(ids, lengths), expected)
    with pytest.raises(ConfigError, match="'last' or 'mean'"):
        SequenceClassifier(_encoder(causal=True), 2, "first")


# -- fine-tuning a tiny masked-LM run --------------------------------------------------------------------
def _pretrain(root: Path, objective: str) -> Path:
    corpus = root / "corpus"
    corpus.mkdir(exist_ok=True)
    rng = random.Random(0)
    for i in range(20):
        lines = (" ".join(rng.choice(WORDS + ["good", "bad"]) for _ in range(8)) for _ in range(40))
        (corpus / f"d{i}.txt").write_text("\n".join(lines))
    out = root / f"run-{objective}"
    cfg = TrainConfig.from_dict(dict(
        arch="sas-p", size="tiny", model={"d_model": 32, "n_layers": 2, "n_heads": 2, "positions": "rope"},
        batch_size=8, seq_len=32, max_steps=10, eval_every=0, eval_batches=1, ckpt_every=0, progress=False,
        out_dir=str(out), optim={"lr": 3e-3, "warmup_fraction": 0.0},
        data={"source": str(corpus), "tokenizer": "byte", "cache_dir": str(root / "cache"),
              "objective": objective, "val_fraction": 0.2}))
    train(cfg)
    return out


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory) -> Path:
    return _pretrain(tmp_path_factory.mktemp("mlm"), "mlm")


def _keyword_task(path: Path, n: int, seed: int, kind: str = "tsv") -> None:
    """Label 1 when the sentence holds 'good', 0 when it holds 'bad' (among 1-4 neutral words)."""
    g = random.Random(seed)
    rows = []
    for _ in range(n):
        label = g.randint(0, 1)
        words = [g.choice(WORDS) for _ in range(g.randint(1, 4))]
        words.insert(g.randint(0, len(words)), "good" if label else "bad")
        rows.append((" ".join(words), label))
    if kind == "tsv":
        path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    else:
        path.write_text("".join(json.dumps({"review": s, "stars": "pos" if y else "neg"}) + "\n"
                                for s, y in rows))


def test_finetuning_learns_a_keyword_task(mlm_run, tmp_path):
    _keyword_task(tmp_path / "train.tsv", 256, seed=1)
    _keyword_task(tmp_path / "dev.tsv", 100, seed=2)
    metrics = finetune(mlm_run, tmp_path / "train.tsv", tmp_path / "dev.tsv", "sst2",
                       out_dir=tmp_path / "out", epochs=4, batch_size=16, lr=3e-3)
    record = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert record["metrics"] == metrics and record["steps"] == 4 * 16 and record["pooling"] == "first"
    assert record["config"]["dropout"] == 0.1 and len(record["history"]) == 4
    # chance is 0.5; the binomial standard deviation on 100 examples is 0.05
    assert metrics["accuracy"] >= 0.8, record["history"]
    assert record["history"][-1]["train_loss"] < math.log(2)


def test_finetuning_defaults_follow_the_paper(mlm_run):
    cfg = FinetuneConfig()
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.dropout) == (5, 32, 1.5e-4, 0.1)
    optim = cfg.optim()
    assert (optim.name, optim.schedule, optim.final_lr_fraction, optim.eps) == ("adamw", "cosine", 0.0, 1e-6)
    encoder, _, pooling = prepare_encoder(mlm_run, cfg)
    from blocklab.training import load_run

    run = load_run(mlm_run)
    assert encoder.cfg.dropout == 0.1 and run.model.cfg.dropout == 0.0 and pooling == "first"
    assert any(isinstance(m, nn.Dropout) and m.p == 0.1 for m in encoder.modules())
    ids = torch.randint(0, 256, (2, 32))
    torch.testing.assert_close(encoder.eval()(ids), run.model(ids))  # same weights; no dropout in eval


def test_finetuning_lr_schedule_as_applied(mlm_run, tmp_path, monkeypatch):
    """The lr of every update, read from the optimizers: warmup to 1.5e-4, then cosine to ~0."""
    import blocklab.finetune.loop as loop

    applied = []

    def record(opt, args, kwargs):
        applied.append([g["lr"] for g in opt.param_groups])

    def recording(model, cfg):
        optimizers = build(model, cfg)
        for opt in optimizers:
            opt.register_step_pre_hook(record)
        return optimizers

    build = loop.build_optimizers
    monkeypatch.setattr(loop, "build_optimizers", recording)
    _keyword_task(tmp_path / "train.tsv", 64, seed=7)
    finetune(mlm_run, tmp_path / "train.tsv", tmp_path / "train.tsv", "sst2", out_dir=tmp_path / "o",
             batch_size=8)  # 8 steps an epoch, 5 epochs: T = 40, W = 4 warmup steps
    assert len(applied) == 40 and all(len(set(lrs)) == 1 for lrs in applied)  # one lr for every group
    lrs = [lrs[0] for lrs in applied]
    expected = [1.5e-4 * min((s + 1) / 4, (1 + math.cos(math.pi * max(0, s - 4) / 36)) / 2)
                for s in range(40)]
    assert lrs == pytest.approx(expected, rel=1e-9, abs=0)
    assert lrs[0] == pytest.approx(1.5e-4 / 4) and lrs[3] == lrs[4] == pytest.approx(1.5e-4)  # no lr-0 step
    assert lrs[-1] < 1e-2 * 1.5e-4 and lrs == sorted(lrs[:4]) + sorted(lrs[4:], reverse=True)
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["warmup_steps"] == 4


def test_causal_run_is_refused_unless_allowed(tmp_path):
    run = _pretrain(tmp_path, "clm")
    _keyword_task(tmp_path / "t.tsv", 16, seed=3)
    with pytest.raises(ConfigError, match="allow_causal"):
        finetune(run, tmp_path / "t.tsv", tmp_path / "t.tsv", "sst2")
    metrics = finetune(run, tmp_path / "t.tsv", tmp_path / "t.tsv", "sst2", out_dir=tmp_path / "o",
                       allow_causal=True, max_steps=2, batch_size=8)
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["pooling"] == "last"
    assert 0.0 <= metrics["accuracy"] <= 1.0


def test_cli_generic_task_and_regression(mlm_run, tmp_path, capsys):
    from blocklab.cli import main

    _keyword_task(tmp_path / "train.jsonl", 64, seed=4, kind="jsonl")
    _keyword_task(tmp_path / "dev.jsonl", 32, seed=5, kind="jsonl")
    code = main(["finetune", "--run", str(mlm_run), "--train", str(tmp_path / "train.jsonl"), "--eval",
                 str(tmp_path / "dev.jsonl"), "--task", "generic", "--text-columns", "review",
                 "--label-column", "stars", "--epochs", "1", "--out", str(tmp_path / "cli")])
    assert code == 0
    record = json.loads((tmp_path / "cli" / "metrics.json").read_text())
    assert record["label_names"] == ["neg", "pos"]
    assert set(record["metrics"]) == {"accuracy", "f1", "mcc", "score"}
    assert "accuracy" in capsys.readouterr().out
    assert main(["finetune", "--run", str(mlm_run), "--train", str(tmp_path / "train.jsonl"), "--eval",
                 str(tmp_path / "dev.jsonl"), "--task", "mrpc"]) == 2  # its columns are not in the file

    # STS-B regression through the CLI, on a TSV in GLUE's layout: the score counts the 'good' sentences
    stats = pytest.importorskip("scipy.stats")
    g = random.Random(6)
    lines = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"]
    for i in range(48):
        pair = [" ".join([g.choice(WORDS), g.choice(["good", "bad"])]) for _ in range(2)]
        lines.append(f"{i}\tmain-captions\tMSRvid\t2012test\t{i}\tnone\tnone\t{pair[0]}\t{pair[1]}\t"
                     f"{2.5 * sum('good' in s for s in pair):.3f}")
    (tmp_path / "sts.tsv").write_text("\n".join(lines) + "\n")
    assert main(["finetune", "--run", str(mlm_run), "--train", str(tmp_path / "sts.tsv"), "--eval",
                 str(tmp_path / "sts.tsv"), "--task", "stsb", "--epochs", "2", "--batch-size", "16", "--lr",
                 "3e-3", "--out", str(tmp_path / "sts")]) == 0
    assert "pearson" in capsys.readouterr().out
    metrics = json.loads((tmp_path / "sts" / "metrics.json").read_text())["metrics"]
    rows = [json.loads(line) for line in (tmp_path / "sts" / "predictions.jsonl").read_text().splitlines()]
    preds, labels = [r["prediction"] for r in rows], [r["label"] for r in rows]
    assert labels == pytest.approx([float(line.split("\t")[-1]) for line in lines[1:]])
    assert len(set(preds)) > 1  # a non-constant regressor, so the correlations are not the 0 fallback
    assert metrics["pearson"] == pytest.approx(stats.pearsonr(preds, labels).statistic, abs=1e-6)
    assert metrics["spearman"] == pytest.approx(stats.spearmanr(preds, labels).statistic, abs=1e-6)
    assert metrics["score"] == pytest.approx((metrics["pearson"] + metrics["spearman"]) / 2)
