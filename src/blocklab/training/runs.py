"""Open a model folder: a finished (or interrupted) run directory with its model, tokenizer and config
(`load_run`), or a blocklab export (`load_model_folder`), which the command line takes alike."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from blocklab.data import Tokenizer, load_tokenizer
from blocklab.model.config import ModelConfig
from blocklab.runtime import LanguageModel
from blocklab.training import checkpoint as ckpt
from blocklab.training.config import TrainConfig
from blocklab.util.commands import pasteable
from blocklab.util.errors import ConfigError


def sampling_with_beams(sampling: dict[str, Any]) -> list[str]:
    """The sampling settings among `sampling` (temperature, top_k, top_p, seed) that a beam search, which
    samples nothing, cannot take: any given but a temperature of 0 (greedy) and the seed, which draws
    nothing by itself."""
    return [k for k, v in sampling.items()
            if k != "seed" and v is not None and not (k == "temperature" and v == 0)]


@dataclass
class LoadedRun:
    """A model in eval mode with its tokenizer; `config` is the run's TrainConfig (None for an export
    or a run without config.yaml) and `checkpoint` the weights file it was read from."""

    model: LanguageModel
    tokenizer: Tokenizer
    config: TrainConfig | None
    checkpoint: Path

    def complete(self, prompt: str, max_new_tokens: int, stop: bool = True, num_beams: int = 1,
                 **sampling: Any) -> str:
        """The text the model writes after `prompt`, decoded with the KV cache (`LanguageModel.generate`;
        `sampling`: temperature, top_k, top_p, seed; greedy by default; with `num_beams` > 1 the best
        hypothesis of a beam search, `blocklab.runtime.beam_search`, which takes no sampling setting).
        With `stop` it ends at the tokenizer's end-of-text token, which is not part of the text."""
        prompt_ids = self.tokenizer.encode(prompt)
        if not prompt_ids:
            raise ConfigError("the prompt is empty: give at least one character of text to continue.")
        ids = torch.tensor([prompt_ids], device=next(self.model.parameters()).device)
        stops = [self.tokenizer.eos_id] if stop else None
        if num_beams != 1:
            from blocklab.runtime.beam_search import beam_search

            drawn = {k: sampling[k] for k in sampling_with_beams(sampling)}
            if drawn:
                raise ConfigError(f"num_beams = {num_beams} runs a beam search, which samples nothing: "
                                  f"drop {drawn}.")
            out = beam_search(self.model, ids, num_beams, max_new_tokens, stop_tokens=stops).sequences
        else:
            out = self.model.generate(ids, max_new_tokens, stop_tokens=stops, **sampling)
        new = out[0, len(prompt_ids):].tolist()
        if stops and new and new[-1] in stops:
            new = new[:-1]
        return self._text_after(prompt_ids, new)

    def _text_after(self, prompt_ids: list[int], new: list[int]) -> str:
        """The text of `new` as it reads after the prompt: decoded with the prompt and cut after it,
        since a decoder may treat a text's first token apart (sentencepiece's, as Llama's, drops the
        space that begins it: "Hello world" + "is" rather than " is"); decoded alone when the
        prompt's text is not a prefix of the whole."""
        head = self.tokenizer.decode(prompt_ids)
        whole = self.tokenizer.decode(prompt_ids + new)
        return whole[len(head):] if whole.startswith(head) else self.tokenizer.decode(new)


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None, device: str = "cpu",
             verify: bool = True) -> LoadedRun:
    """The model of a run's latest (or the given) checkpoint in eval mode, with the run's tokenizer.
    With `verify`, the weights, model_config.json and tokenizer.json must match the sha256 the
    checkpoint recorded (blocklab.util.integrity)."""
    run = Path(run_dir)
    if not (run / "model_config.json").is_file():
        raise FileNotFoundError(f"{str(run)!r} is not a blocklab run directory (no model_config.json); "
                                "give the out_dir of `blocklab train` or a run under a compare's runs/.")
    path = Path(checkpoint) if checkpoint is not None else ckpt.latest_checkpoint(run)
    if path is None:
        raise FileNotFoundError(f"run {str(run)!r} has no checkpoint yet.")
    if verify:
        ckpt.verify_checkpoint(path, run, files=("model.safetensors",))
    model = LanguageModel(ModelConfig.from_dict(json.loads((run / "model_config.json").read_text())))
    ckpt.load_weights(path, model)
    config = TrainConfig.load(run / "config.yaml") if (run / "config.yaml").is_file() else None
    return LoadedRun(model.to(torch.device(device)).eval(), load_tokenizer(run), config, path)


def load_model_folder(folder: str | Path, device: str = "cpu", verify: bool = True) -> LoadedRun:
    """The model and tokenizer of a run directory (its latest checkpoint: `load_run`) or of a blocklab
    export (`save_pretrained(..., format="blocklab")`, as `blocklab export` and `blocklab import-hf`
    write it; in its saved dtype), in eval mode on `device`: what `blocklab generate`, `eval` and
    `finetune` take, so that an imported checkpoint is used like a run. A folder that is neither
    raises FileNotFoundError saying what it is and what to give instead."""
    path = Path(folder)
    if (path / "model_config.json").is_file():
        return load_run(path, device=device, verify=verify)
    if _export_config(path) is None:
        raise FileNotFoundError(_not_a_model_folder(path))
    return _load_export(path, device, verify)


def _export_config(folder: Path) -> dict[str, Any] | None:
    """The config.json of a blocklab-format export in `folder` (it names blocklab_format_version);
    None for anything else (no folder, no config.json, a Hugging Face checkpoint)."""
    from blocklab.interop.checkpoint import VERSION_KEY

    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and VERSION_KEY in data else None


def _not_a_model_folder(folder: Path) -> str:
    """Why `folder` is no model folder, and what to give instead."""
    from blocklab.interop.import_hf import is_hf_checkpoint

    allowed = ("give a run directory (the --out of blocklab train, or a compare's runs/<run>) or a blocklab "
               "export (the --out of blocklab export or blocklab import-hf).")
    if not folder.is_dir():
        what = "a file" if folder.exists() else "no such folder"
        return f"{str(folder)!r} is not a blocklab run directory ({what}): {allowed}"
    if is_hf_checkpoint(folder):
        model_type = json.loads((folder / "config.json").read_text())["model_type"]
        command = pasteable("blocklab", "import-hf", folder, "--out", "OUT")
        return (f"{str(folder)!r} is a Hugging Face {model_type} checkpoint, not a blocklab run directory or "
                f"export: import it first ({command}), then give OUT.")
    return (f"{str(folder)!r} is not a blocklab run directory (no model_config.json) nor a blocklab export "
            f"(no config.json with blocklab_format_version): {allowed}")


def _load_export(folder: Path, device: str, verify: bool) -> LoadedRun:
    """A blocklab export as a LoadedRun (no TrainConfig); it needs its tokenizer.json, with an
    end-of-text token inside the model's vocabulary (the separator that evaluation and fine-tuning
    put around texts, and where generation stops)."""
    from blocklab.data.tokenizer import KNOWN_EOS
    from blocklab.interop.checkpoint import load_pretrained
    from blocklab.interop.export_files import WEIGHTS_NAME

    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"the blocklab export {str(folder)!r} has no tokenizer.json, and generating, "
                          "evaluating and fine-tuning need the model's tokenizer: copy the model's "
                          "tokenizer.json into the folder (or import or export it again with its tokenizer).")
    model = load_pretrained(folder, device=device, verify=verify).eval()
    tokenizer = load_tokenizer(folder)
    if tokenizer.eos_id >= model.cfg.vocab_size:  # none of KNOWN_EOS: load_tokenizer appended one
        raise ConfigError(f"the tokenizer of {str(folder)!r} has none of the end-of-text tokens "
                          f"{', '.join(KNOWN_EOS)}, which blocklab uses as the separator (the one it would "
                          f"add is id {tokenizer.eos_id}, past the model's {model.cfg.vocab_size} ids).")
    return LoadedRun(model, tokenizer, None, folder / WEIGHTS_NAME)
