"""`tritonforge bench`: measure a running server (tokens/s, TTFT, ITL per path and concurrency)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..spec.ports import LOCAL_GRPC_URL
from ..spec.settings import positive_int, positive_ints
from .arguments import add_load_arguments, repository_tokenizer, require_tool, say


def bench_command(args: argparse.Namespace) -> int:
    """Measure a running server: output tokens/s, TTFT and ITL per path and concurrency, efficiency vs direct."""
    import datetime
    import json
    import tempfile

    from ..clients.client import check_serving
    from ..tools.benchmark import (
        DEFINITIONS,
        PATH_MODELS,
        add_efficiency,
        machine_description,
        make_prompts,
        markdown,
        measure_server,
    )

    paths = tuple(p.strip() for p in args.paths.split(",") if p.strip())
    unknown = set(paths) - set(PATH_MODELS)
    if unknown or not paths:
        raise ValueError(f"--paths: unknown {sorted(unknown)}; known: {sorted(PATH_MODELS)}")
    if args.tool == "perf_analyzer":
        require_tool("perf_analyzer")
    prompts = make_prompts(repository_tokenizer(args.repository), 256, args.max_prompt_tokens)
    check_serving(args.url, {PATH_MODELS[path]: f"--paths {path}" for path in paths})
    with tempfile.TemporaryDirectory() as work:
        rows = measure_server(args.url, prompts, paths=paths,
                              concurrencies=args.concurrency,
                              output_tokens=args.output_tokens, duration_s=args.duration_s, tool=args.tool,
                              work=Path(work), label=args.repository.name, progress=say)
    add_efficiency(rows)
    result = {"meta": {"machine": machine_description(), "date": datetime.date.today().isoformat(),
                       "tool": args.tool, "output_tokens": args.output_tokens, "duration_s": args.duration_s,
                       "url": args.url, "definitions": DEFINITIONS}, "rows": rows}
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(row["errors"] == 0 for row in rows) else 1


def add_parser(command) -> None:
    bench = command("bench", "measure a running server: tokens/s, TTFT, ITL per path")
    bench.add_argument("repository", type=Path, help="the served repository (for its tokenizer)")
    bench.add_argument("--url", default=LOCAL_GRPC_URL, help="gRPC host:port")
    bench.add_argument("--paths", default="direct,ensemble,bls",
                       help="comma-separated: direct (tensorrt_llm), ensemble, bls")
    bench.add_argument("--concurrency", type=positive_ints, default="1,8,32,128",
                       help="concurrent streams per point, comma-separated")
    add_load_arguments(bench, tokens_help="min_tokens = max_tokens per request",
                       tool_help="load generator; perf_analyzer needs a server started with --open-apis")
    bench.add_argument("--max-prompt-tokens", type=positive_int, default=32, help="prompt length at most")
    bench.add_argument("--json", type=Path, default=None, help="also write the figures here")
    bench.set_defaults(func=bench_command)
