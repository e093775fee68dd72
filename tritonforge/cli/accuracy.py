"""`tritonforge eval`: does the served engine answer like its checkpoint? (exit 1 when it does not)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..facts.ports import host_port
from ..facts.settings import add_arguments, given, positive_int


def eval_command(args: argparse.Namespace) -> int:
    """Compare a served repository's engine with its Hugging Face checkpoint; non-zero exit when it fails."""
    import json

    from ..tools.accuracy import Thresholds, run_eval

    thresholds = Thresholds(**given(args, Thresholds))
    report = run_eval(args.url, args.reference, args.tokenizer or args.reference, prompts_path=args.prompts,
                      tokens=args.tokens, thresholds=thresholds, choices_path=args.choices)
    print(report.table())
    if args.json:
        args.json.write_text(json.dumps(report.record(), indent=2) + "\n")
    return 0 if report.passed else 1


def add_parser(command) -> None:
    from ..tools.accuracy import Thresholds

    evaluation = command("eval", "does the served engine answer like its checkpoint?")
    evaluation.add_argument("--url", required=True, type=host_port,
                            help="Triton's gRPC address of the served repository, HOST:PORT")
    evaluation.add_argument("--reference", type=Path, required=True, help="the Hugging Face checkpoint")
    evaluation.add_argument("--tokenizer", type=Path, default=None,
                            help="tokenizer folder (default: the checkpoint's; the repository's is preprocessing/"
                                 "tokenizer)")
    evaluation.add_argument("--prompts", type=Path, default=None, help="JSONL of {\"prompt\": ...} (default: a "
                                                                        "small built-in set)")
    evaluation.add_argument("--choices", type=Path, default=None,
                            help="multiple-choice JSONL of {\"question\", \"choices\", \"answer\"} (default: none: no "
                                 "multiple-choice check)")
    evaluation.add_argument("--tokens", type=positive_int, default=32, help="greedy tokens compared per prompt")
    add_arguments(evaluation, Thresholds)
    evaluation.add_argument("--json", type=Path, default=None,
                            help="write the figures here (default: none: printed only)")
    evaluation.set_defaults(func=eval_command)
