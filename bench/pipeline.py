"""How much of the engine's token rate reaches the client: the engine model called (a) directly, (b) through
the ensemble, (c) through the BLS, on one server, streaming, side by side at each concurrency.

Every request asks for exactly --output-tokens tokens (min_tokens = max_tokens), so every path does equal
work. The terms (output tokens/s, TTFT, ITL, p50/p99, efficiency) are defined under every printed table
(tritonforge.tools.benchmark.DEFINITIONS).

Load generators (tritonforge/tools/benchmark.py): `asyncio` (tritonclient's asyncio gRPC streaming; one stream
per concurrent user, each sending its next request when the previous one ends) or `perf_analyzer`
(--streaming, string inputs through --input-data; timings read from its --profile-export-file). perf_analyzer
needs glibc 2.38. `tritonforge bench` measures an already running server the same way.

Run from a fresh clone (after scripts/bootstrap.sh):
  .venv/bin/python bench/pipeline.py                       # tiny model, transformers + replay engines, CPU
  .venv/bin/python bench/pipeline.py --report bench/results/pipeline-cpu.json   # re-render table and plot
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.native import TEXT_BACKENDS
from tritonforge.builder.repository import tokenizer_dir
from tritonforge.facts.paths import PATHS, path_list
from tritonforge.facts.settings import positive_ints
from tritonforge.serve.server import TritonServer
from tritonforge.tools.benchmark import (
    DEFAULT_MS_PER_TOKEN,
    add_efficiency,
    machine_description,
    make_prompts,
    markdown,
    measure_server,
    with_extension,
    write_results,
)
from tritonforge.tools.tiny_model import SHAPES, make_tiny_model

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def build_repository(args, model_dir: Path, engine: str, output: Path) -> None:
    serving = configs.ServingConfig(
        max_batch_size=max(args.concurrency), preprocessing_instances=args.preprocessing_instances,
        postprocessing_instances=args.postprocessing_instances, bls_instances=args.bls_instances,
        bls_max_concurrency=args.bls_max_concurrency,
        engine_instances=args.engine_instances if engine == "replay" else 1,
        postprocessing_delay_microseconds=args.postprocessing_delay_us,
        postprocessing_preserve_ordering=not args.postprocessing_unordered,
        coalescer=not args.no_coalescer,
        coalescer_max_responses_per_second=args.coalescer_max_responses_per_second)
    engine_batch = args.engine_max_batch_size or max(args.concurrency)
    # The transformers engine's GPUs (one instance each, each with engine_batch slots) and tensor parallelism.
    gpu_options = {"gpus": args.gpus, "tp_size": args.tp_size} if engine == "transformers" else {}
    build(BuildOptions(model=model_dir, output=output, engine=engine, max_batch_size=engine_batch, **gpu_options,
                       max_input_len=args.max_prompt_tokens + 8,
                       max_seq_len=args.max_prompt_tokens + 8 + args.output_tokens, dtype=args.dtype,
                       serving=serving, replay_step_ms=args.replay_step_ms, replay_native=args.replay_native,
                       replay_sender_threads=args.replay_sender_threads, stream_interval=args.stream_interval,
                       response_lanes=args.response_lanes, text_backend=args.text_backend,
                       force=True), progress=lambda _: None)


def measure_engine(args, model_dir: Path, engine: str, work: Path, rows: list[dict], save) -> None:
    repository = work / f"repository-{engine}"
    build_repository(args, model_dir, engine, repository)
    prompts = make_prompts(tokenizer_dir(repository), 256, args.max_prompt_tokens)
    progress(f"{engine}: starting tritonserver")
    # Open APIs: perf_analyzer reads the model config and statistics; the ports are local to this run.
    server = TritonServer(repository, ready_timeout_s=300, restricted_apis="", extra_args=trace_args(args)).start()
    progress(f"{engine}: server ready, warming up")
    try:
        def on_row(row: dict) -> None:
            rows.append(row)
            save()

        measured = measure_server(server.grpc_url, prompts, concurrencies=args.concurrency,
                                  output_tokens=args.output_tokens, duration_s=args.duration_s, tool=args.tool,
                                  work=work, label=engine, server_pid=server.pid, on_row=on_row,
                                  progress=lambda line: print(line, file=sys.stderr, flush=True),
                                  stacks_dir=args.stacks_dir, paths=args.paths,
                                  ms_per_token=args.replay_step_ms if engine == "replay" else DEFAULT_MS_PER_TOKEN)
        if any(row["errors"] for row in measured):
            print(f"--- tritonserver log ---\n{server.failure_summary(max_lines=40)}", file=sys.stderr)
    except BaseException:
        print(f"--- tritonserver log ---\n{server.failure_summary(max_lines=40)}", file=sys.stderr)
        raise
    finally:
        server.stop()


# Triton writes traces in files of this many (FILE.0, FILE.1, ...) and drops the last, partial file (with 0,
# "one file at shutdown", 2.51 wrote none when the bench stopped it).
TRACES_PER_FILE = 100


def trace_args(args) -> list[str]:
    """tritonserver's per-request trace (timestamps of every step of one request in N), for bench/trace.py."""
    if args.trace_file is None:
        return []
    return ["--trace-config", f"triton,file={args.trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"rate={args.trace_rate}", "--trace-config", "count=-1",
            "--trace-config", f"triton,log-frequency={TRACES_PER_FILE}"]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _setting_notes(args) -> list[str]:
    """Lines for the report about settings that change what a client receives."""
    notes = []
    if args.stream_interval > 1:
        notes.append(f"engines stream {args.stream_interval} tokens a response after the first "
                     f"(--stream-interval {args.stream_interval})")
    notes.append("the ensemble calls the engine directly (--no-coalescer)" if args.no_coalescer else
                 f"the ensemble's engine step is the coalescer (at most {args.coalescer_max_responses_per_second} "
                 f"responses a second)")
    return notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint directory (default: a tiny model)")
    parser.add_argument("--model-size", choices=sorted(SHAPES), default="tiny", help="size of the built model")
    parser.add_argument("--engines", default="transformers,replay", help="transformers, replay (comma-separated)")
    parser.add_argument("--concurrency", type=positive_ints, default="1,8,32,128")
    parser.add_argument("--paths", type=path_list, default=PATHS,
                        help="paths to measure, comma-separated (efficiency needs direct)")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=10.0, help="measurement time per point")
    parser.add_argument("--tool", choices=("asyncio", "perf_analyzer"), default="asyncio")
    parser.add_argument("--replay-step-ms", type=float, default=8.5,
                        help="replay engine step: 8.5 ms gives ~15k tokens/s at 128 streams")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--preprocessing-instances", type=int, default=2)
    parser.add_argument("--postprocessing-instances", type=int, default=2)
    parser.add_argument("--bls-instances", type=int, default=1)
    parser.add_argument("--replay-native", action="store_true",
                        help="the replay engine as a C++ backend (as NVIDIA's, it costs the pipeline no Python)")
    parser.add_argument("--replay-sender-threads", type=int, default=1,
                        help="--replay-native: threads sending the engine's responses")
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="streamed tokens per engine response after the first (1: every token)")
    parser.add_argument("--response-lanes", type=int, default=BuildOptions.response_lanes,
                        help="Python engines: threads sending responses off the engine's thread (0: none)")
    parser.add_argument("--engine-instances", type=int, default=1,
                        help="replay engine: Python stubs sharing the engine's batch (8 reach a real engine's rate "
                             "on 16 cores)")
    parser.add_argument("--gpus", type=int, default=BuildOptions.gpus,
                        help="transformers engine: one instance on each of GPUs 0..N-1 (build --gpus)")
    parser.add_argument("--tp-size", type=int, default=BuildOptions.tp_size,
                        help="transformers engine: GPUs one instance's weights are split over (build --tp-size)")
    parser.add_argument("--engine-max-batch-size", type=int, default=None,
                        help="requests the engine runs at once (default: the largest concurrency); 128 with the "
                             "replay engine's 8.5 ms step is a ~15k tokens/s engine")
    parser.add_argument("--postprocessing-delay-us", type=int,
                        default=configs.ServingConfig.postprocessing_delay_microseconds,
                        help="postprocessing's dynamic-batching queue delay (default: the build's)")
    parser.add_argument("--text-backend", choices=TEXT_BACKENDS, default=BuildOptions.text_backend,
                        help="postprocessing as the Python model or its C++ twin (build --text-backend)")
    parser.add_argument("--postprocessing-unordered", action="store_true",
                        help="postprocessing without preserve_ordering (NVIDIA's setting)")
    parser.add_argument("--no-coalescer", action="store_true",
                        help="the ensemble's engine step straight to the engine (build --no-coalescer)")
    parser.add_argument("--coalescer-max-responses-per-second", type=int,
                        default=configs.ServingConfig.coalescer_max_responses_per_second,
                        help="the coalescer's budget (default: the build's)")
    parser.add_argument("--bls-max-concurrency", type=int, default=configs.ServingConfig.bls_max_concurrency,
                        help="requests one BLS instance runs (default: the build's)")
    parser.add_argument("--trace-file", type=Path, default=None,
                        help="write Triton's per-request trace as FILE.0, FILE.1, ... (bench/trace.py reads them)")
    parser.add_argument("--trace-rate", type=int, default=8, help="with --trace-file: trace one request in N")
    parser.add_argument("--stacks-dir", type=Path, default=None,
                        help="with py-spy installed: record one stub of each model at the largest concurrency")
    parser.add_argument("--name", default="pipeline", help="results file stem under bench/results/")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--note", action="append", default=[], help="a line for the report")
    parser.add_argument("--report", type=Path, default=None, help="re-render the table and plot of a JSON file")
    args = parser.parse_args()
    # A run stopped by `timeout` or a CI job still stops its tritonserver (the `finally` blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.report:
        result = json.loads(args.report.read_text())
        write_results(result, args.report.with_name(args.report.name.removesuffix(".json")))
        print(markdown(result))
        return 0
    if args.tool == "perf_analyzer" and not shutil.which("perf_analyzer"):
        parser.error("perf_analyzer is not on PATH")
    rows: list[dict] = []
    settings = {k: v for k, v in vars(args).items() if k not in ("report", "results_dir", "note")}
    result = {"meta": {"machine": machine_description(), "date": datetime.date.today().isoformat(),
                       "tool": args.tool, "output_tokens": args.output_tokens, "duration_s": args.duration_s,
                       "settings": {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()},
                       "notes": args.note + _setting_notes(args)},
              "rows": rows}
    stem = args.results_dir / args.name
    stem.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every point: a run cut short still leaves its figures
        add_efficiency(rows)
        with_extension(stem, ".json").write_text(json.dumps(result, indent=1) + "\n")

    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        if args.model is None:
            progress(f"building a {args.model_size} model")
        model_dir = args.model or make_tiny_model(work / "model", shape=SHAPES[args.model_size])
        for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
            measure_engine(args, model_dir, engine, work, rows, save)
    add_efficiency(rows)
    write_results(result, stem)
    print()
    print(markdown(result))
    print(f"results: {stem}.json / .md / .png")
    return 0 if all(row["errors"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
