"""Continued pretraining: start a run from a saved model (`TrainConfig.init_from`), optionally
retrofitted with a value path (`TrainConfig.retrofit`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from blocklab.model.config import ModelConfig
from blocklab.runtime import LanguageModel
from blocklab.training import checkpoint as ckpt
from blocklab.training.config import UNNAMED_SIZE, TrainConfig
from blocklab.util.errors import ConfigError


def load_init(cfg: TrainConfig, resume_dir: Path | None = None) -> tuple[LanguageModel, Path | None]:
    """Continued pretraining: the float32 model saved in `cfg.init_from` (a run directory, a
    `blocklab.interop.save_pretrained` export, or a Hugging Face GPT-2 / Llama checkpoint folder, read
    as `blocklab import-hf` reads it), retrofitted with the value path `cfg.retrofit`
    (`blocklab.interop.retrofit`: ResFormer's mix starts at the baseline where the formula allows,
    a low-cost use of value residuals per Value Residual Learning), and the source's tokenizer.json
    (None when an export has none).

    A resume (`resume_dir`, the run's folder) that has a checkpoint needs nothing of the source: the
    model is built from the run's model_config.json (the source's config, retrofitted) and its weights
    come from the checkpoint; the tokenizer is the path the run recorded, whose file `resumed_tokenizer`
    replaces by the run's copy when it is gone. So the run goes on after its source was moved or
    deleted."""
    from blocklab.interop import load_pretrained, retrofit
    from blocklab.interop.import_hf import is_hf_checkpoint, load_hf_checkpoint
    from blocklab.training.runs import load_run

    assert cfg.init_from is not None, "load_init is called for a run that sets init_from"
    if resume_dir is not None and (resume_dir / "model_config.json").is_file() \
            and ckpt.latest_checkpoint(resume_dir) is not None:
        model_cfg = ModelConfig.from_dict(json.loads((resume_dir / "model_config.json").read_text()))
        # the source's tokenizer as the run recorded it (`with_source_tokenizer`), whether or not it is
        # still there: `resumed_tokenizer` then reads the run's copy, and the checkpoint's hash checks it
        recorded = TrainConfig.load(resume_dir / "config.yaml").data.tokenizer \
            if (resume_dir / "config.yaml").is_file() else ""
        return LanguageModel(model_cfg).train(), recorded_tokenizer_file(recorded)
    src = Path(cfg.init_from)
    try:
        if (src / "model_config.json").is_file():
            model = load_run(src).model
        elif is_hf_checkpoint(src):
            model = load_hf_checkpoint(src)
        elif (src / "config.json").is_file():
            model = load_pretrained(src)
        else:
            raise FileNotFoundError(f"TrainConfig.init_from = {cfg.init_from!r} is not allowed: it is "
                                    "neither a run directory (model_config.json) nor a save_pretrained "
                                    "export or Hugging Face checkpoint (config.json).")
    except FileNotFoundError as err:  # a usage error, reported without a traceback
        raise ConfigError(str(err)) from None
    model = model.float().train()
    if cfg.retrofit:
        model = retrofit(model, cfg.retrofit)
    return model, source_tokenizer(cfg.init_from)


def resumed_tokenizer(cfg: TrainConfig, run_dir: Path) -> TrainConfig:
    """`cfg` of a resumed init_from run whose data.tokenizer, the source's tokenizer.json that
    `with_source_tokenizer` recorded, is gone with its source: the run's own copy instead (the same
    file, which the checkpoint's tokenizer hash checks)."""
    tok = recorded_tokenizer_file(cfg.data.tokenizer)
    mine = run_dir / "tokenizer.json"
    if tok is not None and not tok.exists() and mine.is_file():
        return replace(cfg, data=cfg.data.replace(tokenizer=str(mine)))
    return cfg


def recorded_tokenizer_file(tokenizer: str) -> Path | None:
    """data.tokenizer as `with_source_tokenizer` records a source's: its path when it names a file
    tokenizer.json, else None (a kind such as "bpe" or "byte")."""
    return Path(tokenizer) if Path(tokenizer).name == "tokenizer.json" else None


def source_tokenizer(init_from: str) -> Path | None:
    """The tokenizer.json of an init_from source, None when it has none."""
    tok = Path(init_from) / "tokenizer.json"
    return tok if tok.is_file() else None


def with_source_tokenizer(cfg: TrainConfig, source_tok: Path | None) -> TrainConfig:
    """`cfg` whose data is tokenised with the init_from source's tokenizer: its `source_tok` (when it
    has one) replaces data.tokenizer = "bpe", which would train a new one; another tokenizer given is
    kept (`check_init` then checks it is the source's). `blocklab prepare` applies the same rule, so
    that it fills the cache entry `train` reads."""
    if source_tok is not None and cfg.data.tokenizer == "bpe":
        return replace(cfg, data=cfg.data.replace(tokenizer=str(source_tok)))
    return cfg


def source_preset(model: LanguageModel) -> tuple[str, str]:
    """The architecture and size names of a model read from init_from, as a run records them: the
    block preset its fields are nearest to with its value path (`model_card.architecture`, as the HF
    model card names it), and the size preset whose fields it has (vocabulary and context aside, which
    follow the data), else UNNAMED_SIZE."""
    from blocklab.interop.model_card import architecture
    from blocklab.model.presets import SIZE_PRESETS

    m = model.cfg
    size = next((name for name, preset in SIZE_PRESETS.items()
                 if all(getattr(m, f) == v for f, v in preset.fields.items()
                        if f not in ("vocab_size", "context_length"))), UNNAMED_SIZE)
    return architecture(m).name, size


def with_source_preset(cfg: TrainConfig, model: LanguageModel) -> TrainConfig:
    """`cfg` recording the architecture and size of the model it trains, the init_from source's
    (`source_preset`), so that summary.json, the result line, plots and model cards name what trained.
    An arch or size given (not None) that is not the source's is refused, the defaults' names too: the
    source fixes the model, so that name would be a model that never trained."""
    from blocklab.model.presets import split_arch

    arch, size = source_preset(model)

    def same_arch(a: str, b: str) -> bool:
        (block_a, path_a), (block_b, path_b) = split_arch(a), split_arch(b)
        return (block_a, path_a or "standard") == (block_b, path_b or "standard")

    wrong = [f"{name} = {given!r}" for name, given, ok in (
        ("arch", cfg.arch, cfg.arch is None or same_arch(cfg.arch, arch)),
        ("size", cfg.size, cfg.size in (None, size))) if not ok]
    if wrong:
        m = model.cfg
        raise ConfigError(f"{' and '.join(wrong)} with init_from = {cfg.init_from!r} is not allowed: the "
                          f"model trained is the source's, a {arch!r} of size {size!r} ({m.n_layers} layers, "
                          f"d_model {m.d_model}{', retrofitted' if cfg.retrofit else ''}). Drop arch and "
                          f"size (the run records the source's) or give arch={arch} size={size}; to train "
                          "another architecture, leave out init_from (or retrofit a value path).")
    return replace(cfg, arch=arch, size=size)


def check_init(cfg: TrainConfig, model: LanguageModel, source_tok: Path | None, tokenizer) -> None:
    """The source must fit the data: its tokenizer, vocabulary, objective and context length."""
    from blocklab.data import load_tokenizer

    where = f"init_from = {cfg.init_from!r}"
    if source_tok is not None and source_tok.is_file():  # gone with its source: the checkpoint checks it
        if load_tokenizer(source_tok, tokenizer.eos_token, tokenizer.mask_token).hash != tokenizer.hash:
            raise ConfigError(f"data.tokenizer = {cfg.data.tokenizer!r} differs from the tokenizer of "
                              f"{where}; leave data.tokenizer at 'bpe' (then {str(source_tok)!r} is used) "
                              "or give that file.")
    elif cfg.data.tokenizer == "bpe":
        raise ConfigError(f"{where} has no tokenizer.json: set data.tokenizer to the model's tokenizer "
                          "(byte or a tokenizer.json path) rather than training a new BPE (blocklab "
                          "import-hf converts a Hugging Face tokenizer that has none).")
    m = model.cfg
    beyond = _ids_beyond(tokenizer, m.vocab_size, cfg.data.objective)
    if beyond:
        added = " (its end-of-text token was added: set data.eos_token to the tokenizer's own)" \
            if tokenizer.eos_id in beyond else ""
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model of {where} only "
                          f"{m.vocab_size}{added}.")
    if m.causal != (cfg.data.objective == "clm"):
        raise ConfigError(f"data.objective = {cfg.data.objective!r} does not fit the model of {where} "
                          f"(causal = {m.causal}); use {'clm' if m.causal else 'mlm'}.")
    if cfg.seq_len > m.context_length:
        raise ConfigError(f"seq_len = {cfg.seq_len} is longer than the context length {m.context_length} "
                          f"of the model of {where}.")


def _ids_beyond(tokenizer, vocab_size: int, objective: str) -> list[int]:
    """Token ids past the model's vocabulary that the data can hold. A tokenizer without a mask token
    gets one appended (`load_tokenizer`), one past a vocabulary it fills exactly (GPT-2's 50257 ids,
    Llama's); causal LM data never holds it, so only masked LM counts it."""
    return [i for i in range(vocab_size, tokenizer.vocab_size)
            if objective != "clm" or i != tokenizer.mask_id]
