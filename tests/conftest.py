"""Session-wide test settings, and fixtures more than one test file uses."""

import pytest
import torch

# The tests run thousands of tiny float64 ops. Intra-op threads only add synchronisation cost at
# these sizes, and on a busy 2-core machine they make the suite several times slower.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small corpus of Python files (`helpers.write_code_corpus`), one per test module; a module that
    needs another defines its own `corpus`."""
    from helpers import write_code_corpus

    return write_code_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    """A run of two steps trained from `corpus` by `blocklab train` (`helpers.small_run_args`), one per test
    module: what a refused command must leave as it was."""
    from blocklab.cli import main
    from helpers import small_run_args

    root = tmp_path_factory.mktemp("run")
    out = root / "run"
    assert main(["train", *small_run_args(corpus, root / "cache"), "max_steps=2", "--out", str(out)]) == 0
    return out


@pytest.fixture
def reorders(monkeypatch):
    """The row orders the KV caches are given (beam search), other than the identity."""
    from blocklab.runtime.cache import KVCache

    seen: list[list[int]] = []
    real = KVCache.reorder

    def spy(self, rows):
        if not torch.equal(torch.as_tensor(rows).cpu(), torch.arange(self.batch_size)):
            seen.append(torch.as_tensor(rows).tolist())
        return real(self, rows)

    monkeypatch.setattr(KVCache, "reorder", spy)
    return seen
