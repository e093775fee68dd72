"""`tritonforge eval`: does the served engine answer like its checkpoint? (exit 1 when it does not)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..spec.settings import positive_int


def eval_command(args: argparse.Namespace) -> int:
    """Compare a served repository's engine with its Hugging Face checkpoint; non-zero exit when it fails."""
    import json

    from ..tools.accuracy import Thresholds, run_eval

    thresholds = Thresholds(min_greedy_agreement=args.min_greedy_agreement, max_logprob_mae=args.max_logprob_mae,
                            logprob_tolerance=args.logprob_tolerance, max_logprob_off_share=args.max_logprob_off_share,
                            max_task_accuracy_drop=args.max_task_accuracy_drop)
    report = run_eval(args.url, args.reference, args.tokenizer or args.reference, prompts_path=args.prompts,
                      tokens=args.tokens, thresholds=thresholds, choices_path=args.choices)
    print(report.table())
    if args.json:
        args.json.write_text(json.dumps(report.record(), indent=2) + "\n")
    return 0 if report.passed else 1


def add_parser(command) -> None:
    from ..tools.accuracy import Thresholds

    evaluation = command("eval", "does the served engine answer like its checkpoint?")
    evaluation.add_argument("--url", required=True, help="Triton's gRPC address of the served repository")
    evaluation.add_argument("--reference", type=Path, required=True, help="the Hugging Face checkpoint")
    evaluation.add_argument("--tokenizer", type=Path, default=None,
                            help="tokenizer folder (default: the checkpoint's; the repository's is preprocessing/"
                                 "tokenizer)")
    evaluation.add_argument("--prompts", type=Path, default=None, help="JSONL of {\"prompt\": ...} (default: a "
                                                                        "small built-in set)")
    evaluation.add_argument("--choices", type=Path, default=None,
                            help="multiple-choice JSONL of {\"question\", \"choices\", \"answer\"}")
    evaluation.add_argument("--tokens", type=positive_int, default=32, help="greedy tokens compared per prompt")
    evaluation.add_argument("--min-greedy-agreement", type=float, default=Thresholds.min_greedy_agreement,
                            help="least share of prompts whose greedy tokens all agree")
    evaluation.add_argument("--max-logprob-mae", type=float, default=Thresholds.max_logprob_mae,
                            help="largest mean |served - reference| log-probability")
    evaluation.add_argument("--logprob-tolerance", type=float, default=Thresholds.logprob_tolerance,
                            help="a token's log-probability off by more than this (nats) counts as off")
    evaluation.add_argument("--max-logprob-off-share", type=float, default=Thresholds.max_logprob_off_share,
                            help="largest share of tokens off")
    evaluation.add_argument("--max-task-accuracy-drop", type=float, default=Thresholds.max_task_accuracy_drop,
                            help="largest drop of task accuracy against the reference (--choices)")
    evaluation.add_argument("--json", type=Path, default=None, help="write the figures here")
    evaluation.set_defaults(func=eval_command)
