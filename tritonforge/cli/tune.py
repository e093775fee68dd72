"""`tritonforge tune`: measure a grid of the Python steps' serving settings and write the best into the
repository (it starts its own servers)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..spec.settings import non_negative_ints, positive_int, positive_ints
from .arguments import RepositoryInUse, add_load_arguments, repository_tokenizer, require_tool


def tune_command(args: argparse.Namespace) -> int:
    """Measure a grid of serving settings of the Python steps and write the best into the repository."""
    import dataclasses
    import datetime
    import json

    from ..build.tuning import current, grid, plot, tune
    from ..serve.server import serving_processes
    from ..tools.benchmark import machine_description

    repository_tokenizer(args.repository)
    if args.tool == "perf_analyzer":
        require_tool("perf_analyzer")
    serving = serving_processes(args.repository)
    if serving:
        raise RepositoryInUse(f"{args.repository} is served now (process {', '.join(map(str, serving))}): tune "
                              f"rewrites its configs, which a restart of that server would load; stop it first, "
                              f"or tune a copy (cp -r)")
    before = current(args.repository)
    candidates = grid(args.preprocessing, args.postprocessing, args.bls, args.postprocessing_delay_us)
    result = tune(args.repository, candidates, concurrency=args.concurrency, target=args.target,
                  output_tokens=args.output_tokens, duration_s=args.duration_s, tool=args.tool,
                  progress=lambda message: print(message, file=sys.stderr, flush=True))
    print("| candidate | path | output tokens/s | efficiency | TTFT p50 / p99 ms | errors |")
    print("|---|---|---:|---:|---:|---:|")
    for row in result.rows:
        print(f"| {row['engine']} | {row['path']} | {row['output_tokens_per_s']:,.0f} | {row['efficiency']} | "
              f"{row['ttft_ms_p50']} / {row['ttft_ms_p99']} | {row['errors']} |")
    verdict = "reaches" if result.reached_target else "does NOT reach (the best worst-path efficiency is kept)"
    print(f"\n{args.concurrency} streams: {result.chosen.label} {verdict} {args.target} of the engine's tokens/s; "
          f"was {before.label}; written into {args.repository}")
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        title = (f"tune at {args.concurrency} streams — {machine_description()}, {datetime.date.today()}, "
                 f"load: {args.tool}")
        args.results.with_suffix(".json").write_text(json.dumps(
            {"meta": {"title": title, "target": args.target, "concurrency": args.concurrency},
             "chosen": dataclasses.asdict(result.chosen), "reached_target": result.reached_target,
             "rows": result.rows}, indent=1) + "\n")
        plot(result, args.results.with_suffix(".png"), title)
        print(f"results: {args.results.with_suffix('.json')} / .png")
    return 0 if result.reached_target else 1


def add_parser(command) -> None:
    tune_parser = command("tune", "pick pre/post/BLS instance counts from measurements (starts its own servers)")
    tune_parser.add_argument("repository", type=Path,
                             help="a built repository, not being served; its counts are rewritten")
    tune_parser.add_argument("--preprocessing", type=positive_ints, default="2,4", help="instance counts to try")
    tune_parser.add_argument("--postprocessing", type=positive_ints, default="4,8", help="instance counts to try")
    tune_parser.add_argument("--bls", type=positive_ints, default="4,8", help="BLS instance counts to try")
    tune_parser.add_argument("--postprocessing-delay-us", type=non_negative_ints, default="0,1000,3000",
                             help="postprocessing max_queue_delay_microseconds values to try")
    tune_parser.add_argument("--results", type=Path, default=None,
                             help="write STEM.json and STEM.png (throughput against TTFT p99, chosen marked)")
    tune_parser.add_argument("--concurrency", type=positive_int, default=128, help="concurrent streams to tune for")
    tune_parser.add_argument("--target", type=float, default=0.95, help="efficiency to reach vs the engine alone")
    add_load_arguments(tune_parser, tokens_help="tokens per request", tool_help="load generator")
    tune_parser.set_defaults(func=tune_command)
