"""`tritonforge make-tiny-model`: a small random-weight Llama and its tokenizer."""

from __future__ import annotations

import argparse
from pathlib import Path


def make_tiny_model_command(args: argparse.Namespace) -> int:
    from ..tools.tiny_model import SHAPES, make_tiny_model

    if args.output.exists() and (not args.output.is_dir() or any(args.output.iterdir())):
        raise FileExistsError(f"{args.output} exists and is not an empty folder: the tiny model would overwrite "
                              f"what is there; choose a new folder")
    path = make_tiny_model(args.output, tokenizer_family=args.tokenizer, shape=SHAPES[args.size])
    print(f"tiny model ready: {path}")
    return 0


def add_parser(command) -> None:
    tiny = command("make-tiny-model", "write a small random-weight Llama and tokenizer (its text is gibberish)")
    tiny.add_argument("output", type=Path, help="folder to write (a new or empty one)")
    tiny.add_argument("--tokenizer", choices=("bpe", "sentencepiece"), default="bpe", help="tokenizer family")
    tiny.add_argument("--size", choices=("tiny", "1b"), default="tiny",
                      help="tiny: ~1M parameters for CPUs; 1b: a ~1B Llama body for GPU measurements")
    tiny.set_defaults(func=make_tiny_model_command)
