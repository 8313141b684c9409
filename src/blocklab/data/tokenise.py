"""Tokenising a source into a cache entry's shards at the speed of `tokenizers` itself.

The documents are read, parsed and split on the calling thread in chunks of about CHUNK_CHARS
characters; each chunk is encoded (`Tokenizer.encode_batch`, which releases the GIL and spreads the
chunk over the `tokenizers` library's Rayon threads), turned into one id array per split and written by
a single worker thread, in order, while the calling thread reads the next chunk. At most IN_FLIGHT
chunks are read ahead, so memory stays bounded whatever the corpus size. The reading (JSON parsing, the
split's hash of each document name) thus overlaps encoding instead of leaving the encoder's threads idle
(benchmarks/bench_prepare.py, benchmarks/RESULTS.md "Preparing data").

With `progress`, a bar (`blocklab.util.progress.progress_bar`: redrawn on a terminal, lines in a
log) counts the bytes of the source read, against its size when known.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from blocklab.data.config import DataConfig
from blocklab.data.sources import Source, split_documents
from blocklab.data.tokenizer import Tokenizer

CHUNK_CHARS = 4_000_000  # characters per encode_batch call: parallel, yet bounded memory
IN_FLIGHT = 2  # chunks read but not yet written: one encoding, one waiting


class Shards(Protocol):
    """Where the chunks go (`prepare._ShardFiles`): `add` tokenises and appends one chunk of
    (split, text) documents."""

    def add(self, chunk: list[tuple[str, str]], tokenizer: Tokenizer) -> None: ...


def chunks(source: Source, cfg: DataConfig, size: int) -> Iterator[list[tuple[str, str]]]:
    """The (split, text) documents of `source` in source order, in lists of about `size` characters (the
    last one may be empty, so that an empty source still gives one)."""
    chunk: list[tuple[str, str]] = []
    n_chars = 0
    for split, _, text in split_documents(source, cfg):
        chunk.append((split, text))
        n_chars += len(text)
        if n_chars >= size:
            yield chunk
            chunk, n_chars = [], 0
    yield chunk


def write_documents(shards: Shards, source: Source, cfg: DataConfig, tokenizer: Tokenizer,
                    progress: bool = False) -> None:
    """Every document of `source` tokenised into `shards`, chunk by chunk on one worker thread while
    this thread reads ahead (see the module docstring). An error in either thread is raised here once
    the worker has stopped: the chunks not started are dropped, the one being written is finished."""
    pending: collections.deque[tuple[Future[None], int]] = collections.deque()
    with contextlib.ExitStack() as stack:
        bar = _bar(source, progress)
        stack.callback(bar.close)
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blocklab-tokenise")
        stack.callback(worker.shutdown, wait=True, cancel_futures=True)
        for chunk in chunks(source, cfg, CHUNK_CHARS):
            while len(pending) >= IN_FLIGHT:
                _written(pending.popleft(), bar)
            pending.append((worker.submit(shards.add, chunk, tokenizer), source.bytes_read))
        while pending:
            _written(pending.popleft(), bar)
        if bar.total:
            bar.update(bar.total - bar.n)  # a cut corpus (max_chars) is read only in part


def _written(job: tuple[Future[None], int], bar: Any) -> None:
    """Wait for a chunk to be written (raising its error), then move the bar to where it was read."""
    future, position = job
    future.result()
    bar.update(max(0, position - bar.n))


def _bar(source: Source, enabled: bool) -> Any:
    """The progress bar of the bytes read (see the module docstring); a silent one when not `enabled`."""
    if not enabled:
        return _Silent()
    from blocklab.util.progress import progress_bar

    return progress_bar(source.text_bytes(), unit="B", unit_scale=True, unit_divisor=1000, desc="tokenizing",
                        dynamic_ncols=True, leave=False,
                        line_format="blocklab: tokenizing {percentage:3.0f}% {n_fmt}B/{total_fmt}B "
                                    "[{elapsed}<{remaining}, {rate_fmt}]")


class _Silent:
    """The bar's methods, doing nothing (no tqdm import when there is no bar)."""

    n = 0
    total = None

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass
