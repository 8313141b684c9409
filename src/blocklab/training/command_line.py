"""The TrainConfig fields that a command's positionals (`util.argtypes.config_and_overrides`: an
optional YAML training config, then ``key=value`` overrides) give every run of a command that trains
several (compare, reproduce, scaling). Below the command line, so that each command's parser
(`blocklab.cli`, `blocklab.scaling.cli`) reads them the same way without importing another's; imported
where a command runs, not when its parser is built (it loads torch)."""

from __future__ import annotations

from typing import Any

from blocklab.training.config import apply_overrides, read_yaml
from blocklab.util.argtypes import config_and_overrides

# What a command that trains several runs gives each itself: a YAML config's value is replaced (a
# training config names one architecture and one out_dir), an override of one refused by the command.
RUN_OWN_FIELDS = ("arch", "seed", "out_dir")


def config_fields(positionals: list[str]) -> dict[str, Any]:
    """The TrainConfig fields `positionals` give (`config_and_overrides`) to every run of a command that
    trains several: the YAML config's but for RUN_OWN_FIELDS, with the overrides set on them."""
    config, overrides = config_and_overrides(positionals)
    fields = {k: v for k, v in (read_yaml(config) if config else {}).items() if k not in RUN_OWN_FIELDS}
    return apply_overrides(fields, overrides)
