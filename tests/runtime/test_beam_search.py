"""Beam search with blocklab's own KV cache (runtime/beam_search.py) and `blocklab generate --num-beams`.

References: a beam search written here by lists, one prompt at a time, that reruns the whole sequence
through the model for every hypothesis at every step (no cache, no padding, no reordering), with Hugging
Face's rules (2K candidates, only the first K may finish, score / length ** length_penalty, the
early-stop heuristic); and, where transformers is installed, HF's `generate(num_beams=...)` of a
blocklab model exported as a native GPT-2, and of the HF GPT-2 a blocklab export was imported from.
Models are float64 and perturbed away from their init; each search is checked to have changed some
beam's parent (a cache that skipped reordering would give other tokens) and, with stop tokens, to
have finished some hypothesis early.
"""

from __future__ import annotations

import pytest
import torch

from blocklab import LanguageModel, ModelConfig
from blocklab.cli import main
from blocklab.model.presets import BLOCK_PRESETS
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.runtime.beam_search import beam_search
from helpers import padded_prompts
from reference import perturb

BEAMS, NEW = 3, 10
SCALE = 2.0  # perturbation (reference.perturb): next-token entropy ~2.3 nats of at most 4.1
# an untied head: a tied one at random weights mostly repeats the last token, where every search agrees
SMALL = dict(n_layers=3, d_model=32, n_heads=2, mlp_hidden=64, vocab_size=60, context_length=24,
             tie_embeddings=False)
FAMILIES = [*BLOCK_PRESETS, *(f"pre-ln+{p}" for p in VALUE_PATHS if p != "standard"), "sas-p+svformer",
            "shaped+bov", "pre-ln window", "nanochat smear"]
OPTIONS = {"pre-ln window": ("pre-ln", "tiny", dict(window_size=3, window_pattern="SL", positions="rope")),
           "nanochat smear": ("pre-ln", "nanochat-tiny", {})}


def model_of(family: str, seed: int = 0) -> LanguageModel:
    arch, size, extra = OPTIONS.get(family, (family, "tiny", {}))
    torch.manual_seed(seed)
    model = LanguageModel(ModelConfig.from_preset(arch, size, **SMALL, **extra)).double()
    with torch.no_grad():
        return perturb(model, seed=seed + 7, scale=SCALE).eval()




def naive_beams(model, prompt: list[int], k: int, n: int, stops: list[int], length_penalty: float = 1.0):
    """HF's beam search (early_stopping=False) of one prompt by lists, every hypothesis rerun whole:
    [(score, new tokens)] of the finished hypotheses, best first."""
    running = [(torch.tensor(0.0), [])]  # (summed float32 log-probabilities, new tokens)
    finished: list[tuple[torch.Tensor, list[int]]] = []
    keep = max(2, 1 + len(stops)) * k
    for step in range(n):
        candidates = []
        for score, tokens in running:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + tokens]))[0, -1]
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            candidates += [(score + log_probs[t], tokens + [t]) for t in range(len(log_probs))]
        candidates = sorted(candidates, key=lambda c: -float(c[0]))[:keep]
        ends = [c[1][-1] in stops or step + 1 == n for c in candidates]
        for rank, ((score, tokens), end) in enumerate(zip(candidates, ends, strict=True)):
            if end and rank < k:
                finished.append((score / (step + 1) ** length_penalty, tokens))
        finished = sorted(finished, key=lambda c: -float(c[0]))[:k]
        running = [c for c, end in zip(candidates, ends, strict=True) if not end][:k]
        if not running:  # the last step: every candidate ended
            break
        best_running = float(running[0][0] / (step + 1) ** length_penalty)
        if len(finished) == k and best_running <= float(finished[-1][0]):
            break  # the best running beam cannot beat the worst finished one
    return finished


def expected(model, ids, mask, stops, k=BEAMS, returned=BEAMS, pad=None):
    """The reference's `returned` best hypotheses of each prompt alone: (sequences as beam_search
    returns them, scores)."""
    rows, scores = [], []
    for prompt, flags in zip(ids, mask, strict=True):
        best = naive_beams(model, prompt[flags.bool()].tolist(), k, NEW, stops)[:returned]
        rows += [(prompt.tolist(), tokens) for _, tokens in best]
        scores += [float(s) for s, _ in best]
    width = max(len(tokens) for _, tokens in rows)
    fill = pad if pad is not None else stops[0] if stops else 0
    return (torch.tensor([p + t + [fill] * (width - len(t)) for p, t in rows]),
            torch.tensor(scores, dtype=torch.float32))


def stops_that_end_early(model, ids, mask) -> list[int]:
    """Two tokens that the beams without stop tokens write midway: with them as stop tokens some
    hypotheses finish early."""
    free = beam_search(model, ids, BEAMS, NEW, num_return_sequences=BEAMS, attention_mask=mask).sequences
    return sorted({int(free[0, ids.shape[1] + 3]), int(free[BEAMS, ids.shape[1] + 5])})


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_with_the_cache_equals_a_search_that_reruns_every_sequence(family, reorders):
    model = model_of(family)
    ids, mask = padded_prompts(model.cfg.vocab_size)
    for stops in ([], stops_that_end_early(model, ids, mask)):
        reorders.clear()
        got = beam_search(model, ids, BEAMS, NEW, stop_tokens=stops, num_return_sequences=BEAMS,
                          attention_mask=mask)
        want, scores = expected(model, ids, mask, stops)
        assert reorders, "no step changed the beams' parents: the comparison would not test reordering"
        assert torch.equal(got.sequences, want)
        torch.testing.assert_close(got.scores, scores, rtol=0, atol=1e-5)
        if stops:
            assert ended_early(got.sequences[:, ids.shape[1]:], stops)


def ended_early(new: torch.Tensor, stops: list[int]) -> bool:
    """Whether some hypothesis holds a stop token before its last new position."""
    return any(t in stops for row in new.tolist() for t in row[:NEW - 1])


def test_beam_search_with_offloaded_value_tables_equals_resident(reorders):
    """Bank of Values with its tables in host memory: the cache holds slots into the batch's rows."""
    model = model_of("sas-p+bov")
    ids, mask = padded_prompts(model.cfg.vocab_size)
    resident = beam_search(model, ids, BEAMS, NEW, num_return_sequences=BEAMS, attention_mask=mask)
    model.offload_value_tables()
    offloaded = beam_search(model, ids, BEAMS, NEW, num_return_sequences=BEAMS, attention_mask=mask)
    want, scores = expected(model_of("sas-p+bov"), ids, mask, [])
    assert reorders
    assert torch.equal(offloaded.sequences, resident.sequences) and torch.equal(offloaded.sequences, want)
    assert torch.equal(offloaded.scores, resident.scores)
    torch.testing.assert_close(offloaded.scores, scores, rtol=0, atol=1e-5)


def test_one_beam_is_greedy_decoding():
    model = model_of("sas-p")
    ids, mask = padded_prompts(model.cfg.vocab_size)
    one = beam_search(model, ids, 1, NEW, attention_mask=mask)
    assert torch.equal(one.sequences, model.generate(ids, NEW, attention_mask=mask))
    assert not torch.equal(beam_search(model, ids, BEAMS, NEW, attention_mask=mask).sequences, one.sequences)


def test_bad_settings_are_refused():
    model = model_of("pre-ln")
    ids = torch.ones(1, 3, dtype=torch.long)
    for kwargs, says in [(dict(num_beams=0), "num_beams = 0"), (dict(num_return_sequences=4), "from 1 to"),
                         (dict(length_penalty=float("nan")), "length_penalty"),
                         (dict(early_stopping="sometimes"), "early_stopping"),
                         (dict(max_new_tokens=30), "more than context_length")]:
        with pytest.raises(ValueError, match=says):
            beam_search(model, ids, **{"num_beams": 3, "max_new_tokens": 4, **kwargs})


# -- Hugging Face's beam search ---------------------------------------------------------------------
GPT2_LIKE = dict(norm="layernorm", positions="learned", mlp_act="gelu_tanh", bias=True)


def _hf_beams(hf, ids, mask, stops, pad, **rules):
    with torch.no_grad():
        return hf.generate(ids, attention_mask=mask, num_beams=BEAMS, num_return_sequences=BEAMS,
                           max_new_tokens=NEW, do_sample=False, pad_token_id=pad, eos_token_id=stops or None,
                           return_dict_in_generate=True, output_scores=True, **rules)


HF_RULES = [{}, dict(early_stopping=True), dict(length_penalty=2.0, early_stopping="never"),
            dict(length_penalty=-0.5)]


@pytest.mark.parametrize("rules", HF_RULES)
def test_beam_search_equals_hfs_generate_of_the_exported_gpt2(rules, tmp_path):
    """A GPT-2-like Pre-LN exported as a native GPT2LMHeadModel: HF's beams and sequences_scores, also
    with HF's other early-stopping rules and length penalties."""
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    from blocklab.interop import save_pretrained

    if Version(transformers.__version__) < Version("4.50"):
        pytest.skip("HF's beam search before 4.50 (its BeamSearchScorer) divides a finished beam's score by "
                    "another length and stops by other rules: blocklab follows the rules of 4.50 and later")
    model = LanguageModel(ModelConfig.from_preset("pre-ln", "tiny", **{**SMALL, **GPT2_LIKE})).double()
    with torch.no_grad():
        perturb(model, seed=5, scale=SCALE).eval()
    folder = save_pretrained(model, tmp_path / "hf", format="hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).double().eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    ids, mask = padded_prompts(model.cfg.vocab_size)
    found = []
    for stops in ([], stops_that_end_early(model, ids, mask)):
        pad = stops[0] if stops else 0  # HF fills finished hypotheses with the first stop token
        want = _hf_beams(hf, ids, mask, stops, pad, **rules)
        got = beam_search(model, ids, BEAMS, NEW, stop_tokens=stops, num_return_sequences=BEAMS,
                          attention_mask=mask, **rules)
        assert torch.equal(got.sequences, want.sequences)
        torch.testing.assert_close(got.scores, want.sequences_scores, rtol=1e-6, atol=1e-6)  # float32
        found.append(got.sequences)
    assert not torch.equal(*found), "the stop tokens changed nothing: the test could not see their rules"


# -- blocklab generate --num-beams --------------------------------------------------------------------
def test_generate_num_beams_prints_the_best_hypothesis(tmp_path, capsys):
    """A blocklab export with the byte tokenizer: the text of the reference's best hypothesis."""
    from blocklab.data.tokenizer import byte_tokenizer
    from blocklab.interop import save_pretrained

    tok = byte_tokenizer()
    torch.manual_seed(1)
    model = LanguageModel(ModelConfig.from_preset("sas-p", "tiny", **{**SMALL, "vocab_size": tok.vocab_size}))
    with torch.no_grad():
        perturb(model, seed=2, scale=SCALE).eval()
    folder = save_pretrained(model, tmp_path / "export", tokenizer=tok)
    prompt = "ab"
    ids = tok.encode(prompt)
    best = naive_beams(model, ids, BEAMS, NEW, [])[0][1]
    greedy = model.generate(torch.tensor([ids]), NEW)[0, len(ids):].tolist()
    assert best != greedy, "the beams agree with greedy decoding: the test could not tell them apart"
    args = ["generate", "--run", str(folder), "--prompt", prompt, "--max-new-tokens", str(NEW), "--no-stop",
            "--device", "cpu", "--num-beams", str(BEAMS)]
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out == tok.decode(ids + best) + "\n"


@pytest.mark.parametrize("extra", [["--temperature", "0.8"], ["--top-k", "5"], ["--top-p", "0.9"]])
def test_generate_num_beams_refuses_sampling_options(extra, tmp_path, capsys):
    args = ["generate", "--run", str(tmp_path / "nowhere"), "--prompt", "ab", "--num-beams", "2", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: --num-beams 2 ") and extra[0] in err and err.count("\n") == 1


def test_generate_num_beams_must_be_positive(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["generate", "--run", "x", "--prompt", "ab", "--num-beams", "0"])
    assert stop.value.code == 2 and "positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("stop", [True, False])
def test_generate_num_beams_on_an_imported_gpt2_prints_hfs_best_beam(stop, tmp_path, capsys):
    """`blocklab import-hf` of a tiny HF GPT-2, then `blocklab generate --num-beams 3`: the words of the
    best beam of that GPT-2's own `generate(num_beams=3)` (with its end-of-text token as the stop token,
    or none with --no-stop)."""
    pytest.importorskip("transformers")
    from tests.interop.test_model_folders import PROMPT, SPECIALS, import_tiny, word_id

    hf, folder = import_tiny("gpt2", tmp_path, seed=1)
    ids = torch.tensor([[word_id(w) for w in PROMPT.split()]])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=BEAMS, max_new_tokens=12,
                          do_sample=False, pad_token_id=0, eos_token_id=0 if stop else None)
    new = [t for t in out[0, ids.shape[1]:].tolist() if t != 0]
    greedy = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                         pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert new != greedy[:len(new)], "HF's beams agree with greedy decoding: the test could not tell them"
    words = [f"w{t - len(SPECIALS['gpt2'])}" for t in new]
    capsys.readouterr()  # the import's lines
    args = ["generate", "--run", str(folder), "--prompt", PROMPT, "--max-new-tokens", "12", "--num-beams",
            str(BEAMS), "--device", "cpu", *([] if stop else ["--no-stop"])]
    assert main(args) == 0
    assert capsys.readouterr().out == " ".join([PROMPT, *words]) + "\n"


def test_complete_refuses_sampling_settings_with_beams(tmp_path):
    from blocklab.data.tokenizer import byte_tokenizer
    from blocklab.interop import save_pretrained
    from blocklab.training.runs import load_model_folder
    from blocklab.util.errors import ConfigError

    tok = byte_tokenizer()
    cfg = ModelConfig.from_preset("pre-ln", "tiny", **{**SMALL, "vocab_size": tok.vocab_size})
    model = LanguageModel(cfg)
    with torch.no_grad():
        perturb(model, seed=4, scale=SCALE).eval()
    run = load_model_folder(save_pretrained(model, tmp_path / "export", tokenizer=tok))
    with pytest.raises(ConfigError, match=r"num_beams = 2 runs a beam search, which samples nothing: drop "
                                          r"\{'temperature': 0.7\}"):
        run.complete("ab", 4, num_beams=2, temperature=0.7, seed=1)
    with pytest.raises(ConfigError, match=r"drop \{'top_k': 0\}"):  # the command line's rule: any top_k
        run.complete("ab", 4, num_beams=2, top_k=0)
    best = naive_beams(model, tok.encode("ab"), 2, 4, [])[0][1]  # greedy temperature 0 and a seed pass
    assert run.complete("ab", 4, stop=False, num_beams=2, temperature=0.0, seed=1) == tok.decode(best)
