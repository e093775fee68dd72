"""`tritonforge tune`: measure a grid of the Python steps' serving settings and write the best into the
repository (it starts its own servers)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ..facts.settings import add_arguments, given, non_negative_ints, positive_int, positive_ints, setting
from ..runtime.text.tokenization import tokenizer_only_process
from .arguments import LoadOptions, RepositoryInUse, repository_tokenizer, require_tool


@dataclass(frozen=True, kw_only=True)
class TuneOptions(LoadOptions):
    preprocessing: tuple[int, ...] = setting((2, 4), "preprocessing instance counts to try",
                                             parse=positive_ints)
    postprocessing: tuple[int, ...] = setting((4, 8), "postprocessing instance counts to try",
                                              parse=positive_ints)
    bls: tuple[int, ...] = setting((4, 8), "BLS instance counts to try", parse=positive_ints)
    postprocessing_delay_us: tuple[int, ...] = setting((0, 1000, 3000), "postprocessing max_queue_delay_microseconds "
                                                       "values to try", parse=non_negative_ints)
    results: Path | None = setting(None, "write STEM.json and STEM.png (throughput against TTFT p99, chosen marked) "
                                         "(default: none: printed only)",
                                   parse=Path)
    concurrency: int = setting(128, "concurrent streams to tune for", parse=positive_int)
    target: float = setting(0.95, "efficiency to reach vs the engine alone")


def tune_command(args: argparse.Namespace) -> int:
    """Measure a grid of serving settings of the Python steps and write the best into the repository."""
    import dataclasses
    import datetime
    import json

    from ..serve.leftovers import serving_processes
    from ..tools.benchmark import machine_description
    from ..tools.tuning import current, grid, plot, tune

    tokenizer_only_process()  # the prompts are tokenized here; the model runs in the servers tune starts
    options = TuneOptions(**given(args, TuneOptions))
    repository_tokenizer(args.repository)
    if options.tool == "perf_analyzer":
        require_tool("perf_analyzer")
    serving = serving_processes(args.repository)
    if serving:
        raise RepositoryInUse(f"{args.repository} is served now (process {', '.join(map(str, serving))}): tune "
                              f"rewrites its configs, which a restart of that server would load; stop it first, "
                              f"or tune a copy (cp -r)")
    before = current(args.repository)
    candidates = grid(options.preprocessing, options.postprocessing, options.bls, options.postprocessing_delay_us)
    result = tune(args.repository, candidates, concurrency=options.concurrency, target=options.target,
                  output_tokens=options.output_tokens, duration_s=options.duration_s, tool=options.tool,
                  progress=lambda message: print(message, file=sys.stderr, flush=True))
    print("| candidate | path | output tokens/s | efficiency | TTFT p50 / p99 ms | errors |")
    print("|---|---|---:|---:|---:|---:|")
    for row in result.rows:
        print(f"| {row['engine']} | {row['path']} | {row['output_tokens_per_s']:,.0f} | {row['efficiency']} | "
              f"{row['ttft_ms_p50']} / {row['ttft_ms_p99']} | {row['errors']} |")
    verdict = "reaches" if result.reached_target else "does NOT reach (the best worst-path efficiency is kept)"
    print(f"\n{options.concurrency} streams: {result.chosen.label} {verdict} {options.target} of the engine's "
          f"tokens/s; was {before.label}; written into {args.repository}")
    if options.results:
        options.results.parent.mkdir(parents=True, exist_ok=True)
        title = (f"tune at {options.concurrency} streams — {machine_description()}, {datetime.date.today()}, "
                 f"load: {options.tool}")
        options.results.with_suffix(".json").write_text(json.dumps(
            {"meta": {"title": title, "target": options.target, "concurrency": options.concurrency},
             "chosen": dataclasses.asdict(result.chosen), "reached_target": result.reached_target,
             "rows": result.rows}, indent=1) + "\n")
        plot(result, options.results.with_suffix(".png"), title)
        print(f"results: {options.results.with_suffix('.json')} / .png")
    return 0 if result.reached_target else 1


def add_parser(command) -> None:
    tune_parser = command("tune", "pick pre/post/BLS instance counts from measurements (starts its own servers)")
    tune_parser.add_argument("repository", type=Path,
                             help="a built repository, not being served; its counts are rewritten")
    add_arguments(tune_parser, TuneOptions)
    tune_parser.set_defaults(func=tune_command)
