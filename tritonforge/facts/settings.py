"""Settings declared once: the dataclass field of a setting holds its default, its help and its command-line
flag, and the command line is generated from the fields.

`setting(...)` declares a field that is also an option (`--field-name`, or `flag`); `add_arguments` adds a
dataclass's options to a parser; `given` returns only the options the user gave, so that every default
comes from the dataclass and nowhere else. A bool option flips its default: `--no-...` for one that is on.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    help: str
    flag: str | None = None
    parse: Callable[[str], Any] | None = None  # default: the type of the field's default
    choices: tuple | None = None
    group: str | None = None  # an argument group's title
    metavar: str | None = None
    repeat: bool = False  # the flag may be given again, each value one more element of the field's tuple


def setting(default: Any = dataclasses.MISSING, help: str = "", **option) -> Any:
    """A dataclass field that is also a command-line option; without a default the option is required."""
    return dataclasses.field(default=default, metadata={"option": Option(help, **option)})


def _options(cls) -> list[tuple[dataclasses.Field, Option]]:
    return [(field, field.metadata["option"]) for field in dataclasses.fields(cls) if "option" in field.metadata]


def option_flag(cls, name: str) -> str:
    """The command-line flag of `cls`'s field `name`, as `add_arguments` makes it."""
    field = next(field for field in dataclasses.fields(cls) if field.name == name)
    return field.metadata["option"].flag or "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls, prefix: str = "", *, exclude: tuple[str, ...] = (),
                  group: argparse._ArgumentGroup | None = None, retitle: Callable[[str], str] = str) -> None:
    """Add `cls`'s options but the fields named in `exclude`; their values land in `args` as PREFIX + field name,
    and only when given. An option that names no argument group of its own goes into `group` where one is
    given, else onto the parser; the groups the options name are titled `retitle(their name)`."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field, option in _options(cls):
        if field.name in exclude:
            continue
        target = group or parser
        if option.group:
            if option.group not in groups:
                groups[option.group] = parser.add_argument_group(retitle(option.group))
            target = groups[option.group]
        flag = option_flag(cls, field.name)
        common = {"dest": prefix + field.name, "default": argparse.SUPPRESS}
        if field.default is dataclasses.MISSING:
            target.add_argument(flag, required=True, type=option.parse, help=option.help, metavar=option.metavar,
                                dest=prefix + field.name)
        elif option.repeat:
            target.add_argument(flag, action="append", type=option.parse or str, help=option.help,
                                metavar=option.metavar or field.name.upper(), **common)
        elif isinstance(field.default, bool):
            target.add_argument(flag, action="store_false" if field.default else "store_true", help=option.help,
                                **common)
        else:
            parse = option.parse or type(field.default)
            shown = field.default if not isinstance(field.default, tuple) else ",".join(map(str, field.default))
            text = option.help if field.default is None else f"{option.help} (default: {shown})".lstrip()
            metavar = option.metavar or (None if option.choices else field.name.upper())
            target.add_argument(flag, type=parse, choices=option.choices, metavar=metavar, help=text, **common)


def given(args: argparse.Namespace, cls, prefix: str = "") -> dict[str, Any]:
    """The options of `cls` that the user gave, by field name (a repeated one as a tuple)."""
    values = {}
    for field, option in _options(cls):
        if hasattr(args, prefix + field.name):
            value = getattr(args, prefix + field.name)
            values[field.name] = tuple(value) if option.repeat else value
    return values



def comma_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def version(text: str) -> tuple[int, int]:
    """"2.51" → (2, 51)."""
    try:
        major, minor = (int(part) for part in text.split(".")[:2])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a version like 2.51, got {text!r}") from None
    return major, minor


# argparse `type`s for the options' `parse`

def _whole_numbers(text: str, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"expected numbers >= {minimum}, got {text!r}")
    return values


def positive_ints(text: str) -> tuple[int, ...]:
    """An argparse `type` for lists like "1,8,32,128" (concurrencies, instance counts)."""
    return _whole_numbers(text, 1)


def non_negative_ints(text: str) -> tuple[int, ...]:
    """An argparse `type` for lists like "0,200" (delays)."""
    return _whole_numbers(text, 0)


def positive_seconds(text: str) -> float:
    """An argparse `type` for a time limit in seconds: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse `type` for a count of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value
