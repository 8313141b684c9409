"""An adapter that lets EleutherAI's lm-evaluation-harness (``pip install "blocklab[eval]"``) run
any of its tasks on a blocklab run.

```python
from blocklab.eval.harness import BlocklabLM, run_harness

lm = BlocklabLM.from_run("runs/gpt")                       # or BlocklabLM(model, tokenizer)
results = run_harness(lm, ["my_task"], include_path="tasks/")   # lm_eval.simple_evaluate(...)["results"]
```

`BlocklabLM` is a ``TemplateLM``: the harness tokenises (context, continuation) pairs with
`tok_encode` and this class scores them with `blocklab.eval.loglik.score_continuations`.
``loglikelihood_rolling`` scores a whole text in disjoint windows of the context length, the
first one after the separator token (the harness's ``get_rolling_token_windows``), and
``generate_until`` decodes greedily (or samples when the task asks for ``do_sample``) with the
model's KV-cache ``generate`` when it has one, else a plain loop, and cuts the text at the first
stop string. Registered with the harness as model ``"blocklab"`` (``model_args="run=DIR"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import nn

from blocklab.eval.loglik import check_causal, model_device, score_continuations
from blocklab.util.errors import ConfigError


@register_model("blocklab")
class BlocklabLM(TemplateLM):
    """lm-evaluation-harness model around a causal blocklab `LanguageModel` and its tokenizer."""

    def __init__(self, model: nn.Module | None = None, tokenizer=None, run: str | None = None,
                 batch_size: int | str = 16, max_length: int | None = None, max_gen_toks: int = 256,
                 device: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        if isinstance(batch_size, str) and batch_size.strip().isdigit():  # model_args give strings
            batch_size = int(batch_size)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"BlocklabLM batch_size = {batch_size!r} is not allowed: give a positive "
                              "integer (the harness's 'auto' batch-size search is not supported).")
        if model is None:
            if run is None:
                raise ValueError("BlocklabLM needs a model and tokenizer, or run=DIR (a blocklab run "
                                 "directory).")
            from blocklab.training.runs import load_run

            loaded = load_run(run, device=device or ("cuda" if torch.cuda.is_available() else "cpu"))
            model, tokenizer = loaded.model, loaded.tokenizer
        elif device is not None:
            model = model.to(device)
        check_causal(model, "lm-evaluation-harness")
        self.model, self.blocklab_tokenizer = model.eval(), tokenizer
        self.batch_size = batch_size
        self._max_length = max_length or model.cfg.context_length
        self.max_gen_toks = max_gen_toks
        self._device = model_device(model)

    @classmethod
    def from_run(cls, run_dir: str | Path, **kwargs: Any) -> BlocklabLM:
        return cls(run=str(run_dir), **kwargs)

    # -- what TemplateLM needs -----------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.blocklab_tokenizer.eos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,  # noqa: ARG002 (lm-eval's API)
                   **kwargs: Any) -> list[int]:
        return self.blocklab_tokenizer.encode(string)

    def tok_decode(self, tokens: list[int], **kwargs: Any) -> str:
        return self.blocklab_tokenizer.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False,  # noqa: ARG002 (lm-eval's API)
                              **kwargs: Any):
        pairs = [(context, continuation) for _, context, continuation in requests]
        results = score_continuations(self.model, pairs, self.batch_size, self.max_length)
        for (key, _, _), result in zip(requests, results, strict=True):
            if key is not None and key[0] is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests,
                              disable_tqdm: bool = False) -> list[float]:  # noqa: ARG002 (lm-eval's API)
        """Log-likelihood of each whole text, in disjoint windows of `max_length` tokens."""
        out = []
        for request in requests:
            (text,) = request.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            scores = score_continuations(self.model, windows, self.batch_size, self.max_length)
            total = sum(score for score, _ in scores)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests,
                       disable_tqdm: bool = False) -> list[str]:  # noqa: ARG002 (lm-eval's API)
        out = []
        for request in requests:
            context, gen_kwargs = request.args
            kwargs = dict(gen_kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.pop("max_gen_toks", kwargs.pop("max_new_tokens", self.max_gen_toks)))
            temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
            text = self.generate_text(context, max_new, until, temperature)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out

    # -- generation -----------------------------------------------------------------------------------
    @torch.no_grad()
    def generate_text(self, context: str, max_new_tokens: int, until: list[str],
                      temperature: float = 0.0) -> str:
        """Continue `context` by up to `max_new_tokens` tokens; stop at the separator token and cut
        the text before the first of the `until` strings."""
        max_new_tokens = max(1, min(max_new_tokens, self.max_length - 1))
        ids = [self.eot_token_id] + self.tok_encode(context)
        ids = ids[-(self.max_length - max_new_tokens + 1):]  # room for the new tokens
        prompt = torch.tensor([ids], device=self.device)
        eos = self.eot_token_id
        if hasattr(self.model, "generate"):
            tokens = self.model.generate(prompt, max_new_tokens, temperature=temperature,
                                         stop_tokens=[eos])[0, len(ids):].tolist()
        else:
            tokens = greedy_tokens(self.model, prompt, max_new_tokens, eos)
        if eos in tokens:
            tokens = tokens[:tokens.index(eos)]
        text = self.tok_decode(tokens)
        for stop in until:
            if stop:
                text = text.split(stop)[0]
        return text


def greedy_tokens(model: nn.Module, prompt: torch.Tensor, max_new_tokens: int, stop: int) -> list[int]:
    """Greedy decoding without a cache: the whole sequence is re-read for every new token."""
    ids = prompt
    new: list[int] = []
    for _ in range(max_new_tokens):
        token = int(model(ids)[0, -1].argmax())
        new.append(token)
        if token == stop:
            break
        ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
    return new


def run_harness(lm: BlocklabLM, tasks: list[str], include_path: str | Path | list | None = None,
                limit: int | float | None = None, num_fewshot: int | None = None,
                include_defaults: bool = True, **kwargs: Any) -> dict:
    """``lm_eval.simple_evaluate`` on `lm`, with local task YAMLs from `include_path`; its result dict.

    `include_defaults=False` indexes only the local tasks (the harness's own thousands of task
    YAMLs take seconds to index); other keyword arguments go to ``simple_evaluate`` (e.g.
    ``bootstrap_iters=0`` skips the bootstrapped standard errors).
    """
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    paths = include_path if isinstance(include_path, list) else [include_path] if include_path else None
    manager = TaskManager(include_path=[str(p) for p in paths] if paths else None,
                          include_defaults=include_defaults)
    return simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                           num_fewshot=num_fewshot, **kwargs)
