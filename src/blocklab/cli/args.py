"""The `blocklab` command line's parsing beyond argparse, and small helpers of its commands.

`parse` lets key=value overrides (any command's list of positionals) come after options as well as
before them: ``blocklab train arch=pre-ln --out runs/r max_steps=10`` is read as if every override came
first, in the order typed (a later one for the same key still wins). argparse alone takes only the
first run of positionals and calls the rest "unrecognized arguments", which reads as if the key were
wrong. It then refuses any argument that is not valid text (`blocklab.util.pathtext`), naming it.
"""

from __future__ import annotations

import argparse
import shutil
import textwrap

from blocklab.util.argtypes import config_and_overrides, positive_int  # noqa: F401 (cli_args.*)
from blocklab.util.errors import ConfigError
from blocklab.util.pathtext import is_text, not_text


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by `parser` (blocklab's, one subparser per command), overrides after options
    included. Raises ConfigError for an argument that is not valid text; an unknown option, or a
    positional where the command takes none, ends in argparse's own usage error (exit status 2)."""
    args, extras = parser.parse_known_args(argv)
    command = _command_parser(parser, args)
    listed = [a for a in command._actions if not a.option_strings and a.nargs in ("*", "+")]
    if extras:
        unknown = [e for e in extras if e.startswith("-")]
        if unknown or len(listed) != 1:
            where = "" if unknown or not any("=" in e for e in extras) else (
                f" (blocklab {args.command} takes no key=value overrides)")
            parser.error(f"unrecognized arguments: {' '.join(extras)}{where}")
        dest = listed[0].dest
        setattr(args, dest, [*(getattr(args, dest) or []), *extras])
    _last_typed_wins(command, args, argv)
    _check_text(command, args)
    return args


def _last_typed_wins(command: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> None:
    """An option that sets a config field (train's --threads and --out, compare's --threads: the
    command's ``option_fields`` default, {option dest: field}) given together with a ``field=...``
    override: whichever was typed last is kept and the other dropped, so that the value the run uses
    and records is the one typed last, as between two overrides."""
    overrides = getattr(args, "overrides", None) or []
    for dest, key in (getattr(args, "option_fields", None) or {}).items():
        typed = [i for i, item in enumerate(overrides) if item.partition("=")[0].strip() == key]
        if getattr(args, dest) is None or not typed:
            continue
        action = next(a for a in command._actions if a.dest == dest)
        option_at = max(i for i, token in enumerate(argv) if _spells(token, action.option_strings))
        override_at = max(i for i, token in enumerate(argv) if token == overrides[typed[-1]])
        if option_at > override_at:
            args.overrides = [item for i, item in enumerate(overrides) if i not in typed]
        else:
            setattr(args, dest, None)


def _spells(token: str, option_strings: list[str]) -> bool:
    """Whether `token` is one of `option_strings` as argparse reads it: whole, with =value, or a
    prefix of the long form (argparse's abbreviations, unambiguous once parsing has succeeded)."""
    name = token.partition("=")[0]
    return name.startswith("--") and len(name) > 2 and any(o.startswith(name) for o in option_strings)


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The subparser of the command that `args` holds."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[args.command]
    raise ValueError("blocklab's parser has no commands")  # pragma: no cover - build_parser adds them


def _check_text(command: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the first argument that is not valid text, named as typed: --out, RUN, or an override's
    key (data.source) or "the config file" for the train and compare positionals."""
    for action in command._actions:
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        for item in (v for v in values if isinstance(v, str) and not is_text(v)):
            if action.dest == "overrides":
                raise not_text(*_override_named(item))
            name = max(action.option_strings, key=len) if action.option_strings else (
                action.metavar if isinstance(action.metavar, str) else action.dest.upper())
            raise not_text(name, item)


def _override_named(item: str) -> tuple[str, str]:
    """An override's name and value (data.source, its path), or a YAML config's ("the config file")."""
    key, sep, raw = item.partition("=")
    if not sep:
        return "the config file", item
    return (key.strip(), raw) if is_text(key) else ("an override", item)


class _MovedToOverride(argparse.Action):
    """An option that became a TrainConfig override: refused with one line naming the override."""

    def __init__(self, option_strings, dest, field: str = "", **kwargs):
        self.field = field
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ARG002 (argparse's call)
        raise ConfigError(f"{option_string} is now an override, as in blocklab train: write "
                          f"{self.field}={values}")


def add_moved_options(p: argparse.ArgumentParser, moved: dict[str, str]) -> None:
    """Options a command took before its TrainConfig fields became overrides ({option: field}),
    kept out of --help: typed, each stops the command (exit status 2) with one line naming the
    override to write instead, e.g. ``--eval-every is now an override ...: write eval_every=50``."""
    for option, name in moved.items():
        p.add_argument(option, action=_MovedToOverride, field=name, help=argparse.SUPPRESS,
                       dest=f"moved_{name.replace('.', '_')}")


def wrapped(name: str, text: str, width: int = 18, indent: int = 2) -> str:
    """`name` in a column of `width`, `text` wrapped to the terminal beside it."""
    columns = max(60, shutil.get_terminal_size((100, 24)).columns)
    pad = " " * (indent + width + 1)
    body = textwrap.wrap(text, columns - len(pad)) or [""]
    first = f"{' ' * indent}{name:<{width}} {body[0]}"
    return "\n".join([first] + [pad + line for line in body[1:]])


def add_tracking_arguments(p: argparse.ArgumentParser) -> None:
    """`reproduce`'s trackers (`reproduce.tracking`); train and compare take logger=... overrides."""
    p.add_argument("--logger", help="experiment trackers for every run and the report's figures: wandb, "
                   "tensorboard, or both separated by a comma (TrainConfig.logger)")
    p.add_argument("--wandb-project", help="the wandb project (default blocklab)")
