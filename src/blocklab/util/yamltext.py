"""YAML as blocklab reads a user's config: PyYAML's safe loader, with a key given twice refused.

YAML's own rule is that the keys of a mapping are unique, but PyYAML keeps the last of two silently:
``arch: pre-ln`` then, further down, ``arch: sas`` trains SAS, and the reader of the file sees Pre-LN.
`load` refuses such a file (at any depth, in any mapping), naming the key and both lines. A merge key
(``<<: *base``) is YAML's way to take fields from elsewhere and replace some: it is no repeat.
"""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKey(yaml.YAMLError):
    """A mapping gives the same key twice; `key`, and the lines (from 1) where it stands."""

    def __init__(self, key: Any, first: int, second: int):
        self.key, self.first, self.second = key, first, second
        super().__init__(f"the key {key!r} is given twice, at line {first} and line {second}")


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKey(key, seen[key], line)
                seen[key] = line
            except TypeError:  # an unhashable key: the safe loader refuses it itself below
                continue
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """The YAML document `text`, as `yaml.safe_load` reads it, except that a mapping that gives a key
    twice raises DuplicateKey (a yaml.YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
