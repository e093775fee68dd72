"""What the commands share: argparse types that refuse a bad value in one line, the errors of a
missing tool or a repository in use, progress lines, and a built repository's tokenizer."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..builder.repository import tokenizer_dir
from ..facts.contract import DEFAULT_MAX_TOKENS
from ..facts.settings import positive_int, positive_seconds, setting


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    """What `bench` and `tune` both load a server with: tokens a request, time a point, the load generator."""

    output_tokens: int = setting(DEFAULT_MAX_TOKENS, "tokens each request generates (min_tokens = max_tokens)",
                                 parse=positive_int)
    duration_s: float = setting(10.0, "measurement time per point", parse=positive_seconds)
    tool: str = setting("asyncio", "load generator (perf_analyzer reads the server's model configs and statistics: "
                                   "`tritonforge serve --open-apis`)", choices=("asyncio", "perf_analyzer"))


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
    from ..serve.repository import check_repository

    check_repository(repository)
    tokenizer = tokenizer_dir(repository)
    if not tokenizer.is_dir():
        raise FileNotFoundError(f"{repository} has no tokenizer at {tokenizer}: pass a repository `tritonforge "
                                f"build` wrote")
    return tokenizer


