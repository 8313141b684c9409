"""Offloaded Bank of Values tables (runtime/offload.py): E_v in host memory, the rows a batch used on the
device (CPU here: the tables stay in CPU memory and the compact row tables are separate tensors; the
CUDA paths, pinned memory and the side stream, are not exercised).

References: the same model decoding with its tables resident (tokens and every step's logits must be
bit-identical), the tables themselves (each compact row equals E_v at its id), byte counts written by
hand (unique ids x kv_dim x tables x dtype size; Bank of Values Eq. 6) and a standard model's cache.
"""

from __future__ import annotations

import pytest
import torch

from blocklab.accounting import offload_bytes
from blocklab.model.value_paths import is_value_table
from blocklab.model.value_paths.bank import OffloadedTableError
from blocklab.runtime.cache import cache_bytes_per_token
from helpers import make_model

VOCAB = 50
CASES = [("pre-ln", "bov", {}), ("pre-ln", "bov-resformer", {}), ("sas-p", "bov", {}),
         ("pre-ln", "bov", {"shared": True})]
IDS = ["bov", "bov-resformer", "sas-p+bov", "bov-shared"]


def build(arch: str, path: str, options: dict, dtype: torch.dtype = torch.float64):
    """A perturbed 6-layer model (target layers 4 and 5: two tables, or one shared)."""
    return make_model(arch, value_path=path, value_path_options=options, n_layers=6).to(dtype).eval()


def prompts(batch: int = 3, t: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, t), generator=torch.Generator().manual_seed(seed))


def step_logits(model, ids: torch.Tensor, more: torch.Tensor, mask: torch.Tensor | None = None):
    """Logits of the prompt's prefill (every position) and of each token of `more` fed one at a time,
    with the cache that produced them."""
    cache = model.new_cache(ids.shape[0], ids.shape[1] + more.shape[1])
    with torch.no_grad():
        out = [model(ids, cache=cache, attention_mask=mask)]
        out += [model(more[:, i:i + 1], cache=cache) for i in range(more.shape[1])]
    return torch.cat(out, dim=1), cache


def table_count(model) -> int:
    return sum(1 for n, _ in model.named_parameters() if is_value_table(n))


@pytest.mark.parametrize("arch, path, options", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_offloaded_decoding_is_bit_identical_to_resident(arch, path, options, dtype):
    model = build(arch, path, options, dtype)
    ids, more = prompts(), prompts(3, 6, seed=1)
    resident_tokens = model.generate(ids, 8)
    sampled = model.generate(ids, 8, temperature=1.0, seed=3)
    resident, _ = step_logits(model, ids, more)
    model.offload_value_tables()
    assert all(p.device.type == "cpu" for n, p in model.named_parameters() if is_value_table(n))
    offloaded, cache = step_logits(model, ids, more)
    assert cache.value_rows is not None
    assert torch.equal(offloaded, resident)
    assert torch.equal(model.generate(ids, 8), resident_tokens)
    assert torch.equal(model.generate(ids, 8, temperature=1.0, seed=3), sampled)
    model.offload_value_tables(False)  # back: an ordinary cache again, the same tokens
    assert model.new_cache(1, 4).value_rows is None
    assert torch.equal(model.generate(ids, 8), resident_tokens)


@pytest.mark.parametrize("arch, path, options", CASES, ids=IDS)
def test_a_padded_batch_decodes_the_same_with_offloaded_tables(arch, path, options):
    model = build(arch, path, options)
    ids = prompts(3, 8, seed=4)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    mask[2, 6:] = 0  # right padding (generate moves it to the left)
    left = mask.clone()
    left[2] = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1])
    more = prompts(3, 5, seed=5)
    resident = model.generate(ids, 7, attention_mask=mask)
    resident_logits, _ = step_logits(model, ids, more, left)
    model.offload_value_tables()
    assert torch.equal(model.generate(ids, 7, attention_mask=mask), resident)
    offloaded_logits, cache = step_logits(model, ids, more, left)
    assert torch.equal(offloaded_logits, resident_logits)
    # padding positions' ids are looked up too: the slots hold every id of the batch, padding included
    assert cache.value_rows is not None and cache.value_rows.count == len(torch.cat((ids, more), 1).unique())


@pytest.mark.parametrize("arch, path, options", CASES, ids=IDS)
def test_the_device_holds_one_row_per_unique_id_and_table(arch, path, options):
    model = build(arch, path, options)
    tables = {n: p.detach().clone() for n, p in model.named_parameters() if is_value_table(n)}
    model.offload_value_tables()
    ids = prompts(2, 12, seed=6)
    ids[1, :6] = ids[0, :6]  # repeats within the batch: slots are shared between its rows
    cache = model.new_cache(2, 16)
    with torch.no_grad():
        model(ids, cache=cache)
    rows = cache.value_rows
    assert rows is not None
    unique = ids.unique()
    width = model.cfg.attention_shape.kv_dim
    itemsize = next(iter(tables.values())).element_size()
    expected = len(unique) * width * len(tables) * itemsize  # by hand: (unique ids) x d x tables x dtype
    assert sum(t.untyped_storage().nbytes() for t in rows.rows.values()) == expected
    assert cache.value_row_bytes == expected
    assert len(rows.rows) == (1 if options.get("shared") else 2) == len(tables)
    # each slot holds its id's row of E_v
    slot_ids = torch.empty(rows.count, dtype=torch.long)
    stored = cache.token_ids.data[:, :ids.shape[1]].long()  # the cache keeps slots in place of ids
    slot_ids[stored.flatten()] = ids.flatten()
    assert torch.equal(slot_ids.sort().values, unique)
    for name, table in tables.items():  # blocks.<layer>.attn.values.value_table, or the shared one
        key = int(name.split(".")[1]) if name.startswith("blocks.") else None
        assert torch.equal(rows.rows[key], table[slot_ids]), name
    # decoding adds a row per new id only, and never more than |V| or what the cache can still hold
    with torch.no_grad():
        for new in ([[unique[0]], [unique[1]]], [[VOCAB - 1], [VOCAB - 1]], [[VOCAB - 2], [0]]):
            model(torch.tensor(new), cache=cache)
    seen = torch.cat((ids.flatten(), torch.tensor([VOCAB - 1, VOCAB - 2, 0]))).unique()
    assert rows.count == len(seen)
    assert rows.capacity <= min(VOCAB, len(unique) + 2 * (16 - 12))


def test_training_and_cacheless_forward_refuse_offloaded_tables():
    model = build("pre-ln", "bov", {})
    ids = prompts(2, 8)
    model.offload_value_tables()
    with pytest.raises(OffloadedTableError, match=r"offload_value_tables\(False\)"):
        model(ids)
    with pytest.raises(OffloadedTableError, match="without a KV cache"):
        model(ids, labels=ids)
    with pytest.raises(OffloadedTableError, match="gradients"):
        model(ids, cache=model.new_cache(2, 8))  # gradients would not reach the host table
    shared = build("pre-ln", "bov", {"shared": True})
    shared.offload_value_tables()
    with pytest.raises(OffloadedTableError, match="shared"):
        shared(ids)
    model.offload_value_tables(False)  # training works again, and reaches the tables
    model.train()
    model(ids, labels=ids).backward()
    grads = [p.grad for n, p in model.named_parameters() if is_value_table(n)]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_offloading_a_model_without_tables_is_refused():
    with pytest.raises(ValueError, match="no Bank of Values tables"):
        make_model("pre-ln", value_path="value-embed").offload_value_tables()


@pytest.mark.parametrize("options", [{}, {"shared": True}], ids=["own", "shared"])
def test_offload_bytes_match_the_measured_tensors_and_eq6(options):
    model = build("pre-ln", "bov", options, torch.float32)
    standard = make_model("pre-ln", n_layers=6).float()
    cfg = model.cfg
    ids = prompts(2, 16, seed=7)
    report = offload_bytes(cfg, 16, unique_ids=len(ids.unique()), batch=2, dtype_bytes=4)
    model.offload_value_tables()
    cache = model.new_cache(2, 16)
    with torch.no_grad():
        model(ids, cache=cache)
    assert report["cache_bytes"] == cache.nbytes
    assert report["row_bytes"] == cache.value_row_bytes
    assert report["standard_cache_bytes"] == standard.new_cache(2, 16).nbytes
    host = sum(p.untyped_storage().nbytes() for n, p in model.named_parameters() if is_value_table(n))
    assert report["table_bytes"] == host
    assert cache.value_rows is not None and report["offloaded_host_bytes"] == cache.value_rows.host_bytes
    # Eq. 6 by hand: L/3 = 2 target layers of d = 32, T = 16, |V| = 50, float32, two sequences
    tables = 1 if options else 2
    assert report["eq6_saved_bytes"] == 2 * 2 * 32 * 16 * 4 - tables * 32 * VOCAB * 4
    if not options:
        assert report["eq6_saved_bytes"] == 2 * 32 * (2 * 16 - VOCAB) * 4  # (L/3) d (T - |V|), batch 2
    # the value cache the tables replace, less the 4-byte ids and the rows, is what offloading saves
    per_seq = cache_bytes_per_token(cfg, 4, 16)
    assert report["saved_offloaded_bytes"] == (report["standard_cache_bytes"] - 2 * per_seq["total_bytes"]
                                               - report["row_bytes"])
    worst = offload_bytes(cfg, 16, batch=2, dtype_bytes=4)  # every position a new id
    assert worst["unique_ids"] == 32 and worst["row_bytes"] == tables * 32 * 32 * 4


@pytest.mark.slow  # two dynamo traces, about 10 s on a CPU
def test_compiled_decoding_with_and_without_offloading():
    """Offload off: the decoding step still compiles as one graph (fullgraph) with the new branches.
    Offload on: the slot bookkeeping runs eagerly, so a step compiled with graph breaks allowed gives the
    same tokens (the default fullgraph step of `generate(compile=True)` falls back to eager decoding with
    its warning: not tested here, inductor takes too long)."""
    model = build("pre-ln", "bov", {}, torch.float32)
    ids = prompts(2, 6)
    eager = model.generate(ids, 5, compile=False)
    model.compile_decoding(backend="eager", fullgraph=True)
    assert torch.equal(model.generate(ids, 5), eager)
    model.offload_value_tables()
    model.compile_decoding(backend="eager")  # graph breaks allowed
    assert torch.equal(model.generate(ids, 5), eager)
