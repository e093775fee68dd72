"""`tritonforge make-tiny-model`: a small random-weight Llama and its tokenizer."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..facts.settings import add_arguments, given, setting
from ..tools.tiny_model import SHAPES, TOKENIZER_FAMILIES


@dataclass(frozen=True, kw_only=True)
class TinyModelOptions:
    tokenizer: str = setting("bpe", "tokenizer family", choices=TOKENIZER_FAMILIES)
    size: str = setting("tiny", "tiny: ~1M parameters for CPUs; 1b: a ~1B Llama body for GPU measurements",
                        choices=tuple(SHAPES))


def make_tiny_model_command(args: argparse.Namespace) -> int:
    from ..tools.tiny_model import make_tiny_model

    options = TinyModelOptions(**given(args, TinyModelOptions))
    if args.output.exists() and (not args.output.is_dir() or any(args.output.iterdir())):
        raise FileExistsError(f"{args.output} exists and is not an empty folder: the tiny model would overwrite "
                              f"what is there; choose a new folder")
    path = make_tiny_model(args.output, tokenizer_family=options.tokenizer, shape=SHAPES[options.size])
    print(f"tiny model ready: {path}")
    return 0


def add_parser(command) -> None:
    tiny = command("make-tiny-model", "write a small random-weight Llama and tokenizer (its text is gibberish)")
    tiny.add_argument("output", type=Path, help="folder to write (a new or empty one)")
    add_arguments(tiny, TinyModelOptions)
    tiny.set_defaults(func=make_tiny_model_command)
