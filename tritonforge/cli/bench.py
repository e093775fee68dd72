"""`tritonforge bench`: measure a running server (tokens/s, TTFT, ITL per path and concurrency)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..facts.paths import PATH_MODELS, PATHS, path_list
from ..facts.ports import LOCAL_GRPC_URL, host_port
from ..facts.settings import add_arguments, given, positive_int, positive_ints, setting
from ..runtime.text.tokenization import tokenizer_only_process
from .arguments import LoadOptions, repository_tokenizer, require_tool, say


@dataclass(frozen=True, kw_only=True)
class BenchOptions(LoadOptions):
    url: str = setting(LOCAL_GRPC_URL, "gRPC host:port", parse=host_port)
    paths: tuple[str, ...] = setting(PATHS, "comma-separated: " + ", ".join(
        path if PATH_MODELS[path] == path else f"{path} ({PATH_MODELS[path]})" for path in PATH_MODELS),
        parse=path_list)
    concurrency: tuple[int, ...] = setting((1, 8, 32, 128), "concurrent streams per point, comma-separated",
                                           parse=positive_ints)
    max_prompt_tokens: int = setting(32, "prompt length at most", parse=positive_int)
    json: Path | None = setting(None, "also write the figures here (default: none: printed only)",
                                parse=Path)


def bench_command(args: argparse.Namespace) -> int:
    """Measure a running server: output tokens/s, TTFT and ITL per path and concurrency, efficiency vs direct."""
    import datetime
    import json
    import tempfile

    from ..clients.client import check_serving
    from ..tools.benchmark import (
        DEFINITIONS,
        add_efficiency,
        machine_description,
        make_prompts,
        markdown,
        measure_server,
    )

    tokenizer_only_process()  # the prompts are tokenized here; the model runs in the server
    options = BenchOptions(**given(args, BenchOptions))
    paths = options.paths
    if options.tool == "perf_analyzer":
        require_tool("perf_analyzer")
    tokenizer_folder = repository_tokenizer(args.repository)
    check_serving(options.url, {PATH_MODELS[path]: f"--paths {path}" for path in paths})
    prompts = make_prompts(tokenizer_folder, 256, options.max_prompt_tokens)
    with tempfile.TemporaryDirectory() as work:
        rows = measure_server(options.url, prompts, paths=paths,
                              concurrencies=options.concurrency,
                              output_tokens=options.output_tokens, duration_s=options.duration_s, tool=options.tool,
                              work=Path(work), label=args.repository.name, progress=say)
    add_efficiency(rows)
    result = {"meta": {"machine": machine_description(), "date": datetime.date.today().isoformat(),
                       "tool": options.tool, "output_tokens": options.output_tokens, "duration_s": options.duration_s,
                       "url": options.url, "definitions": DEFINITIONS}, "rows": rows}
    print(markdown(result))
    if options.json:
        options.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(row["errors"] == 0 for row in rows) else 1


def add_parser(command) -> None:
    bench = command("bench", "measure a running server: tokens/s, TTFT, ITL per path")
    bench.add_argument("repository", type=Path, help="the served repository (for its tokenizer)")
    add_arguments(bench, BenchOptions)
    bench.set_defaults(func=bench_command)
