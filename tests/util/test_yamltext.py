"""YAML config files (util/yamltext.py), read through `blocklab train`: nesting too deep, bad YAML and a
key given twice are one error line naming the file and the lines; a merge key is no repeat."""

from __future__ import annotations

import pytest

from blocklab.cli import main


def test_yaml_nested_thousands_deep_is_one_error_line(tmp_path, capsys):
    """A config file or an override nested 5,000 deep was a RecursionError traceback."""
    deep = "[" * 5000 + "]" * 5000
    (tmp_path / "deep.yaml").write_text(f"max_steps: 2\nmodel: {{x: {deep}}}\n")
    for argv, named in ((["train", str(tmp_path / "deep.yaml")], "deep.yaml"),
                        (["train", "max_steps=2", f"model.x={deep}"], "override model.x")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: ") and len(err.strip().splitlines()) == 1, err[:300]
        assert named in err and "nested too deeply" in err


def test_bad_yaml_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: 2\nmodel: [1, 2\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "not valid YAML" in err and "line" in err
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    assert main(["train", str(tmp_path / "list.yaml")]) == 2
    assert "mapping" in capsys.readouterr().err


@pytest.mark.parametrize("text, key, lines", [
    ("arch: pre-ln\nmax_steps: 2\narch: sas\n", "arch", (1, 3)),
    ("max_steps: 2\noptim:\n  lr: 1e-3\n  name: adamw\n  lr: 3e-3\n", "lr", (3, 5)),
    ("max_steps: 2\nmodel: {value_path_options: {anchors: [1], anchors: [2]}}\n", "anchors", (2, 2)),
])
def test_a_key_given_twice_in_a_yaml_config_is_refused_with_both_lines(text, key, lines, tmp_path, capsys):
    """PyYAML keeps the last of two equal keys: `arch: pre-ln` then `arch: sas` trained SAS silently."""
    (tmp_path / "twice.yaml").write_text(text)
    assert main(["train", str(tmp_path / "twice.yaml"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "twice.yaml" in err
    assert f"gives {key!r} twice, at line {lines[0]} and line {lines[1]}" in err
    assert not (tmp_path / "run").exists()


def test_a_merge_key_is_no_repeat():
    from blocklab.util import yamltext

    text = "base: &b {lr: 1, name: adamw}\noptim:\n  <<: *b\n  lr: 2\n"
    assert yamltext.load(text) == {"base": {"lr": 1, "name": "adamw"}, "optim": {"lr": 2, "name": "adamw"}}
