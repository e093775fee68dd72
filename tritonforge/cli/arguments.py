"""What the commands share: argparse types that refuse a bad value in one line, the errors of a
missing tool or a repository in use, progress lines, and a built repository's tokenizer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..build.repository import tokenizer_dir


def _whole_numbers(text: str, minimum: int) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"expected numbers >= {minimum}, got {text!r}")
    return values


def positive_ints(text: str) -> list[int]:
    """An argparse `type` for lists like "1,8,32,128" (concurrencies, instance counts)."""
    return _whole_numbers(text, 1)


def non_negative_ints(text: str) -> list[int]:
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


def say(message: str) -> None:
    """A progress line: on stderr, so that stdout keeps only what a command produces."""
    print(message, file=sys.stderr, flush=True)


class ToolMissing(RuntimeError):
    """A program a command runs is not installed."""


class RepositoryInUse(RuntimeError):
    """A repository a command would rewrite is being served."""


def require_tool(name: str) -> None:
    import shutil

    if shutil.which(name) is None:
        raise ToolMissing(f"{name} is not on PATH: it comes with NVIDIA's Triton SDK container "
                          f"(nvcr.io/nvidia/tritonserver:<version>-py3-sdk); or use --tool asyncio")


def repository_tokenizer(repository: Path) -> Path:
    """A built repository's tokenizer folder; refuses a path that is none."""
    from ..serve.server import check_repository

    check_repository(repository)
    tokenizer = tokenizer_dir(repository)
    if not tokenizer.is_dir():
        raise FileNotFoundError(f"{repository} has no tokenizer at {tokenizer}: pass a repository `tritonforge "
                                f"build` wrote")
    return tokenizer


