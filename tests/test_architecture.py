"""The package's structure (docs/architecture.md): the import layers, and its worked example of adding
a value path, run as written in the docs."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import blocklab
from blocklab import ConfigError, LanguageModel, ModelConfig, catalog
from blocklab.model.value_paths import VALUE_PATHS, Registered, ValuePath

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "blocklab"
# The bottom layers: they may import only each other (and torch, the standard library). The model owns
# its config (model/config.py) and its named presets (model/presets.py), so training, interop and the
# rest sit above and import them.


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """Every blocklab module a file imports, at any depth: function-level (lazy) imports and the
    `if TYPE_CHECKING:` blocks that only annotations read count too, since a reader follows them all."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from blocklab import ops` imports the module blocklab.model.ops
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    modules = set(files)
    return {name: _imports(ast.parse(path.read_text()), modules) - {name}
            for name, path in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert "blocklab.model.value_paths.base" in graph and "blocklab.model.config" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_model_config_composes_its_components_checks_by_import():
    """ModelConfig (model/config.py) checks its fields (model/fields.py), its block layout (model/block.py)
    and its value path (the registry) by importing each check, and reads the presets (model/presets.py)
    directly: nothing registers itself by import. The components read the fields from below and never
    import the config above them; the old shim `blocklab.config`, `model/validation.py` and the presets
    above the model are gone."""
    graph = import_graph()
    assert "blocklab.config" not in graph and "blocklab.model.validation" not in graph
    assert "blocklab.presets" not in graph
    assert {"blocklab.model.fields", "blocklab.model.block", "blocklab.model.value_paths",
            "blocklab.model.presets"} <= graph["blocklab.model.config"]
    readers = {m for m, deps in graph.items() if m.startswith("blocklab.model.")
               and "blocklab.model.config" in deps}
    assert readers <= {"blocklab.model.transformer", "blocklab.model.init_schemes"}, readers
    config_source = (SRC / "model" / "config.py").read_text() + (SRC / "model" / "fields.py").read_text()
    assert "def register" not in config_source and "global " not in config_source


def test_the_catalog_describes_the_registered_value_paths_from_above_the_model():
    """Every value path of a paper has a catalog entry, which names no unregistered one; the model's
    registry keeps its class, equation and defaults, and nothing in the model reads the catalog."""
    assert set(VALUE_PATHS) - set(catalog.VARIANTS) == {"standard"}
    assert all(catalog.variant(name).paper for name in catalog.VARIANTS)
    assert {f.name for f in dataclasses.fields(Registered)} == {"module", "description", "defaults"}
    graph = import_graph()
    assert not [m for m, deps in graph.items()
                if m.startswith("blocklab.model") and "blocklab.catalog" in deps]
    assert layer("blocklab.catalog") == LAYER_OF["runtime"] + 1 < layer("blocklab.interop.model_card")


# The layers, bottom first: a module may import its own layer and those below, never one above. A module
# is in the layer of its package (or root module) under blocklab; the command line (the cli/ package and
# each package's cli.py) is the top layer. The package root itself
# (blocklab/__init__.py: `__version__` and the public names, loaded lazily) is not a layer.
LAYERS: list[tuple[str, ...]] = [
    ("util",),  # errors, the config base, locks, disk-full, checksums, file modes, path text, figures
    ("model",),  # the definition
    ("runtime", "statistics"),  # what runs a model; claims and statistics
    ("catalog",),  # what tooling reads about each variant: papers, plot titles, optimizer roles, rules
    ("accounting", "recipes", "data"),
    ("interop",),
    ("training",),
    ("analysis", "eval", "finetune", "launch"),
    ("report", "plot"),
    ("compare",),
    ("reproduce",),
    ("scaling",),
    ("rounds",),  # seeds added until decided, over compare, reproduce and scaling
    ("headlines",),  # the reproduction page's headline numbers: the ladders' and the rounds' verdicts
    ("cli", "__main__"),
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def layer(module: str) -> int | None:
    """The layer of a blocklab module (None: the package root)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    if parts[-1] == "cli":
        return len(LAYERS) - 1
    return LAYER_OF[parts[1]]


def test_every_module_has_a_layer():
    unplaced = {m.split(".")[1] for m in import_graph() if "." in m} - set(LAYER_OF)
    assert not unplaced, f"modules in no layer of LAYERS: {sorted(unplaced)}"


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports (module, what it imports) that run from a layer up to a higher one."""
    return sorted((m, dep) for m, deps in graph.items() for dep in deps
                  if layer(m) is not None and layer(dep) is not None and layer(dep) > layer(m))


def test_no_import_runs_up_the_layers():
    graph = import_graph()
    up = upward(graph)
    assert not up, f"imports that run back up the layers: {up}"
    assert graph["blocklab.util.errors"] == set()
    assert graph["blocklab.util.configbase"] == {"blocklab.util.errors"}
    # the model's config reads its presets from below it, in the model
    assert "blocklab.model.presets" in graph["blocklab.model.config"]
    # blocklab.cli (the `blocklab` command) is imported by no other package: a package's own cli.py
    # reads its arguments with helpers from below (training.command_line, util.argtypes)
    outside = {m: deps for m, deps in graph.items()
               if not m.startswith("blocklab.cli") and m not in ("blocklab", "blocklab.__main__")}
    into_cli = {m for m, deps in outside.items()
                if any(d.split(".")[:2] == ["blocklab", "cli"] for d in deps)}
    assert not into_cli, into_cli
    # the definition imports nothing that runs it
    assert not {d for m, deps in graph.items() if m.startswith("blocklab.model") for d in deps
                if d.startswith("blocklab.runtime")}


def test_the_layer_rule_finds_an_upward_import():
    assert layer("blocklab.model.block") == 1 and layer("blocklab.runtime.cache") == 2
    assert layer("blocklab.scaling.cli") == len(LAYERS) - 1 and layer("blocklab") is None
    graph = {"blocklab.model.block": {"blocklab.runtime.cache", "blocklab.util.errors"},  # up, down
             "blocklab.runtime.cache": {"blocklab.model.carry"},  # down
             "blocklab.training.loop": {"blocklab.training.step", "blocklab.scaling.cli"},  # same; up
             "blocklab.scaling.cli": {"blocklab.cli.args"},  # a command line imports another's: same layer
             "blocklab": {"blocklab.cli"}}  # the package root is in no layer
    assert upward(graph) == [("blocklab.model.block", "blocklab.runtime.cache"),
                             ("blocklab.training.loop", "blocklab.scaling.cli")]


def test_the_import_finder_counts_type_checking_and_function_level_imports():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from blocklab.a import X\n"
                     "def f():\n    import blocklab.b\n")
    assert _imports(tree, {"blocklab.a", "blocklab.b", "blocklab.c"}) == {"blocklab.a", "blocklab.b"}


def test_the_model_config_checks_and_reads_presets_on_its_own_import():
    """`import blocklab.model.config` alone gives a config that checks its value path and block layout and
    reads the named presets: nothing else has to be imported first to register them."""
    code = "\n".join([
        "import blocklab.model.config as c",
        "from blocklab.util.errors import ConfigError",
        "for bad, message in ((dict(value_path='nope'), \"value_path = 'nope' is not allowed\"),",
        "                     (dict(block_layout='nope'), \"block_layout = 'nope' is not allowed\")):",
        "    try:",
        "        c.ModelConfig(**bad)",
        "        raise SystemExit(f'{bad} passed')",
        "    except ConfigError as e:",
        "        assert message in str(e), e",
        "assert c.ModelConfig.from_preset('sas-p', 'tiny', n_layers=2).n_layers == 2",
    ])
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_blocklab_model_config_is_the_models_class():
    """The public `blocklab.ModelConfig` is the model's class, which reads the named presets."""
    code = ("import blocklab, blocklab.model, blocklab.model.config as c; "
            "assert blocklab.ModelConfig is blocklab.model.ModelConfig is c.ModelConfig; "
            "assert blocklab.ModelConfig.from_preset('sas-p', 'tiny', n_layers=2).n_layers == 2")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# -- the worked example of docs/architecture.md ---------------------------------------------------
def worked_example(monkeypatch: pytest.MonkeyPatch) -> type[ValuePath]:
    """Execute the example's code block exactly as the docs show it, as the module the docs name (a
    dataclass reads its module's namespace)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"<!-- worked-example:begin -->\s*```python\n(.*?)```\s*<!-- worked-example:end -->",
                      text, re.S)
    assert block, "docs/architecture.md lost its worked example"
    module = types.ModuleType("blocklab.model.value_paths.scaled")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(block[1], "docs/architecture.md", "exec"), module.__dict__)
    return module.ScaledValues


@pytest.fixture
def scaled(monkeypatch):
    """The example registered as the docs say: its registry and catalog entries, evaluated as written."""
    cls = worked_example(monkeypatch)
    text = (ROOT / "docs" / "architecture.md").read_text()
    for marker, kind, names in (("worked-example-entry", Registered, {"ScaledValues": cls}),
                                ("worked-example-catalog", catalog.Variant, {})):
        block = re.search(rf"<!-- {marker}:begin -->\s*```python\n(.*?)```", text, re.S)
        assert block, f"docs/architecture.md lost the worked example's {marker}"
        entries = eval("{" + block[1] + "}", {kind.__name__: kind, **names})
        assert list(entries) == ["scaled-values"] and isinstance(entries["scaled-values"], kind)
        monkeypatch.setitem(VALUE_PATHS if kind is Registered else catalog.VARIANTS, "scaled-values",
                            entries["scaled-values"])
    return VALUE_PATHS["scaled-values"]


SIZES = dict(n_layers=3, d_model=16, n_heads=4, n_kv_heads=2, vocab_size=31, context_length=12, mlp_hidden=24)


def _perturbed(cfg: ModelConfig, seed: int) -> LanguageModel:
    torch.manual_seed(seed)
    model = LanguageModel(cfg).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # away from initialisation, where s_n = 1 would hide a missing scale
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def test_worked_example_matches_a_baseline_with_scaled_value_weights(scaled):
    """V_n = s_n H W^V_n equals a standard model whose W^V_n is multiplied by s_n (an independent
    reference: the baseline's own attention and nothing of the example's code)."""
    cfg = ModelConfig.from_preset("pre-ln+scaled-values", "tiny", **SIZES,
                                  value_path_options=dict(scale=0.5, layers=[1, 2]))
    model = _perturbed(cfg, seed=3)
    scales = {i: model.blocks[i].attn.values.scale.gain.item() for i in (1, 2)}  # (scaled: its entry)
    assert all(abs(s - 0.5) > 1e-3 for s in scales.values())  # moved from the option's 0.5
    assert model.blocks[0].attn.values.scale is None

    baseline = LanguageModel(cfg.replace(value_path="standard", value_path_options={})).double()
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("scale.gain")}
    for i, s in scales.items():
        state[f"blocks.{i}.attn.values.w_v.weight"] = s * state[f"blocks.{i}.attn.values.w_v.weight"]
    baseline.load_state_dict(state)
    ids = torch.randint(0, 31, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), baseline(ids), rtol=0, atol=1e-12)


def test_worked_example_decodes_with_a_cache_trains_and_checks_its_options(scaled):
    cfg = ModelConfig.from_preset("sas-p+scaled-values", "tiny", **{**SIZES, "n_kv_heads": None},
                                  value_path_options=dict(scale=2.0))
    model = _perturbed(cfg, seed=5)
    ids = torch.randint(0, 31, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, 10)
        steps = [model(ids[:, :6], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(6, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)

    model(ids).logsumexp(-1).sum().backward()
    assert all(model.blocks[i].attn.values.scale.gain.grad.abs().item() > 0 for i in range(3))
    assert blocklab.list_presets()["value_paths"]["scaled-values"] == scaled.description
    from blocklab.analysis.scalars import scalar_series  # the catalog's title of its scalar, in the plots
    panels = scalar_series([{"step": 1, "scalars": {"blocks.1.attn.values.scale": [2.5]}}])["panels"]
    assert panels == {"value scale s_n": {"lines": {"L1": [2.5]}, "bands": {}}}

    with pytest.raises(ConfigError, match="scale'] = 0 is not allowed"):
        ModelConfig.from_preset("pre-ln+scaled-values", "tiny", value_path_options=dict(scale=0.0))
    with pytest.raises(ConfigError, match="does not take"):
        ModelConfig.from_preset("pre-ln+scaled-values", "tiny", value_path_options=dict(sclae=2.0))
    with pytest.raises(ConfigError, match="must be a number"):
        ModelConfig.from_preset("pre-ln+scaled-values", "tiny", value_path_options=dict(scale="big"))


# -- the worked example of adding a block layout ----------------------------------------------------
@pytest.fixture
def two_norm_layout(monkeypatch):
    """The layout example of docs/architecture.md executed as written, its registry entry undone after."""
    from blocklab.model import block as block_module

    text = (ROOT / "docs" / "architecture.md").read_text()
    found = re.search(r"<!-- layout-example:begin -->\s*```python\n(.*?)```\s*<!-- layout-example:end -->",
                      text, re.S)
    assert found, "docs/architecture.md lost its block-layout example"
    monkeypatch.setattr(block_module, "BLOCK_LAYOUTS", dict(block_module.BLOCK_LAYOUTS))
    namespace: dict = {"__name__": "blocklab.model.block_example"}
    exec(compile(found[1], "docs/architecture.md", "exec"), namespace)
    assert "parallel-two-norms" in block_module.BLOCK_LAYOUTS
    return namespace["TwoNormParallelBlock"]


def test_layout_example_follows_its_equation_decodes_and_trains(two_norm_layout):
    """out = a X + b_SA MHA(N1(X)) + b_FF MLP(N2(X)), composed here from the block's own parts, away
    from initialisation (every gain and weight moved), for both blocks of a two-layer model."""
    cfg = ModelConfig.from_preset("pre-ln", "tiny", **SIZES, block_layout="parallel-two-norms",
                                  attn_skip_gain=0.0, trainable_block_gains=True)
    model = _perturbed(cfg, seed=7)
    assert all(isinstance(b, two_norm_layout) for b in model.blocks)
    ids = torch.randint(0, 31, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        x = model.tok_emb(ids)
        carry = blocklab.model.Carry(token_ids=ids, positions=torch.arange(12), x0=x)
        for blk in model.blocks:
            a, _ = blk.attn(blk.norm1(x), carry)
            x = blk.mlp_skip(x) + blk.attn_branch(a) + blk.mlp_branch(blk.mlp(blk.norm2(x)))
        torch.testing.assert_close(model(ids), model.head_logits(model.norm(x)), rtol=0, atol=1e-12)
        cache = model.new_cache(2, 12)
        steps = [model(ids[:, :7], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(7, 12)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(ids), rtol=0, atol=1e-10)
    model(ids).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.blocks[1].norm2.parameters())
    with pytest.raises(ConfigError, match="block_layout = 'sideways' is not allowed: choose one of"):
        ModelConfig.from_preset("pre-ln", "tiny", block_layout="sideways")
    with pytest.raises(ConfigError, match="attn_skip_gain = 1.0 is not allowed: this block has one skip"):
        ModelConfig.from_preset("pre-ln", "tiny", block_layout="parallel-two-norms")  # its own check


@pytest.mark.parametrize("first_import", [
    "from blocklab.model.config import ModelConfig",
    "import blocklab.model.config as c; ModelConfig = c.ModelConfig",
    "import blocklab.model.value_paths.options; from blocklab.model.config import ModelConfig",
    "from blocklab.util.configbase import ConfigBase; from blocklab.model.config import ModelConfig",
])
def test_model_config_works_on_its_own_import(first_import):
    """`ModelConfig()` checks its block layout and value path however the config was first imported (it
    imports the checks it runs)."""
    code = "\n".join([
        first_import,
        "cfg = ModelConfig()",
        "assert cfg.value_path == 'standard' and cfg.block_layout == 'pre-ln'",
        "from blocklab.util.errors import ConfigError",
        "for bad in (dict(value_path='nope'), dict(block_layout='nope')):",
        "    try:",
        "        ModelConfig(**bad)",
        "        raise SystemExit(f'{bad} passed')",
        "    except ConfigError:",
        "        pass",
    ])
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
