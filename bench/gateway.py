"""The OpenAI gateway's overhead: tokens/s and time to first token through the gateway (streaming
/v1/completions) against the ensemble over gRPC, side by side on one server with the replay engine, at 1, 32
and 128 streams. Every request asks for exactly --output-tokens tokens (min_tokens = max_tokens), so both
paths do equal work. The load: Python clients (`--tool python`: the real `openai` client against the
gateway, tritonclient asyncio against the ensemble) or perf_analyzer for both (`--tool perf_analyzer`: its
OpenAI service kind against the gateway, gRPC against the ensemble), whose C++ load costs the shared host far
less CPU a chunk than the Python clients.

  .venv/bin/python bench/gateway.py --name gateway-cpu-bls   # the gateway as shipped (BLS), CPU machine
  .venv/bin/python bench/gateway.py --gateway-model ensemble  # writes bench/results/gateway-cpu.{json,md}
  python3 bench/gateway.py --replay-step-ms 8.5 --engine-instances 16 --engine-max-batch-size 128 \\
      --postprocessing-instances 8 --bls-instances 16 --gateway-workers 4 --tool perf_analyzer \\
      --name gateway-gpu-perf-analyzer-bls                   # the GPU machine, at a real engine's rate
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.repository import tokenizer_dir
from tritonforge.facts.contract import BLS_MODEL, ENSEMBLE_MODEL
from tritonforge.facts.settings import positive_ints
from tritonforge.gateway.metrics import ITL_METRIC, TTFT_METRIC
from tritonforge.gateway.serving import DEFAULT_MODEL, SERVED_MODEL_NAME
from tritonforge.serve.ports import free_port
from tritonforge.serve.server import TritonServer
from tritonforge.tools.benchmark import (
    Timing,
    asyncio_load,
    machine_description,
    make_prompts,
    perf_analyzer_load,
    perf_analyzer_openai_load,
    spread_load,
    summarize,
    timed_share,
    with_extension,
)
from tritonforge.tools.profiling import tree_cpu_seconds, waited_children_cpu_seconds
from tritonforge.tools.tiny_model import make_tiny_model

RESULTS_DIR = Path(__file__).resolve().parent / "results"


async def _gateway_load(base_url: str, prompts, concurrency: int, output_tokens: int, seconds: float):
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    deadline = time.perf_counter() + seconds
    timings: list[Timing] = []

    async def user(index: int) -> None:
        sent = 0
        while sent == 0 or time.perf_counter() < deadline:
            text, _ = prompts[(index + sent * concurrency) % len(prompts)]
            timing = Timing(sent=time.perf_counter(), arrivals=[], tokens=0)
            try:
                stream = await client.completions.create(
                    model=SERVED_MODEL_NAME, prompt=text, max_tokens=output_tokens, stream=True,
                    extra_body={"min_tokens": output_tokens})
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].text:
                        timing.arrivals.append(time.perf_counter())
                timing.tokens = output_tokens
            except openai.OpenAIError as error:
                timing.error = str(error)
            timings.append(timing)
            sent += 1

    start = time.perf_counter()
    await asyncio.gather(*(user(index) for index in range(concurrency)))
    await client.close()
    end = max((t.arrivals[-1] for t in timings if t.arrivals), default=time.perf_counter())
    return timings, end - start


def _ensemble_share(url: str, prompts, concurrency: int, output_tokens: int, seconds: float, start_at: float):
    return timed_share(start_at, lambda: asyncio_load(url, "ensemble", prompts, concurrency, output_tokens,
                                                      seconds, 1))


def _gateway_share(base_url: str, prompts, concurrency: int, output_tokens: int, seconds: float, start_at: float):
    return timed_share(start_at, lambda: asyncio.run(_gateway_load(base_url, prompts, concurrency, output_tokens,
                                                                   seconds)))


GATEWAY_LATENCIES = {"ttft": TTFT_METRIC, "itl": ITL_METRIC}


def gateway_latency_totals(base_url: str) -> dict[str, tuple[float, float]]:
    """The gateway's own TTFT and ITL histograms (its /metrics): (sum of seconds, count) of each."""
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        values = dict(line.rsplit(" ", 1) for line in response.read().decode().splitlines()
                      if line and not line.startswith("#"))
    return {key: (float(values.get(f"{name}_sum", 0)), float(values.get(f"{name}_count", 0)))
            for key, name in GATEWAY_LATENCIES.items()}


def gateway_latency_means(before: dict, after: dict) -> dict[str, float | None]:
    """Mean TTFT and ITL in ms over a point, as the gateway saw them: from a request's arrival to the chunk
    it hands to the HTTP connection. Beside the client's figures, they say whether time was lost before the
    gateway (gRPC, server) or after it (HTTP, client)."""
    means = {}
    for key in GATEWAY_LATENCIES:
        seconds = after[key][0] - before[key][0]
        count = after[key][1] - before[key][1]
        means[f"gateway_{key}_ms_mean"] = round(seconds / count * 1000, 2) if count else None
    return means


def perf_analyzer_point(path: str, concurrency: int, args, prompts, grpc_url: str, base_url: str,
                        work: Path) -> tuple[list[Timing], float, float]:
    """One point with perf_analyzer as the load: the timings, the wall time and perf_analyzer's CPU seconds."""
    cpu = waited_children_cpu_seconds()
    if path == "ensemble":
        timings, wall = perf_analyzer_load(grpc_url, "ensemble", prompts, concurrency, args.output_tokens,
                                           args.duration_s, work, ms_per_token=args.replay_step_ms)
    else:
        timings, wall = perf_analyzer_openai_load(base_url, SERVED_MODEL_NAME, prompts, concurrency,
                                                  args.output_tokens, args.duration_s, work,
                                                  ms_per_token=args.replay_step_ms)
    return timings, wall, waited_children_cpu_seconds() - cpu


def measure_point(path: str, concurrency: int, args, prompts, grpc_url: str, base_url: str, gateway_pid: int,
                  work: Path) -> dict:
    """One path at one concurrency, with the CPU time the load generator and the gateway spent per chunk."""
    gateway_cpu = tree_cpu_seconds(gateway_pid)
    latencies = gateway_latency_totals(base_url)
    if args.tool == "perf_analyzer":
        timings, wall, load_cpu = perf_analyzer_point(path, concurrency, args, prompts, grpc_url, base_url, work)
    else:
        share, target = (_ensemble_share, grpc_url) if path == "ensemble" else (_gateway_share, base_url)
        timings, wall, load_cpu = spread_load(share, target, prompts, concurrency, args.output_tokens,
                                              args.duration_s, args.load_processes)
    gateway_cpu = tree_cpu_seconds(gateway_pid) - gateway_cpu
    gateway_means = gateway_latency_means(latencies, gateway_latency_totals(base_url)) if path == "gateway" else {}
    chunks = max(1, sum(len(timing.arrivals) for timing in timings))
    return {"concurrency": concurrency, "path": path, **summarize(timings, wall, concurrency), **gateway_means,
            "load_cpu_us_per_chunk": round(load_cpu / chunks * 1e6),
            "gateway_cpu_us_per_chunk": round(gateway_cpu / chunks * 1e6) if path == "gateway" else None}


def wait_healthy(base_url: str, timeout_s: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway at {base_url} did not become healthy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=positive_ints, default="1,32,128")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--replay-step-ms", type=float, default=20.0,
                        help="20 ms keeps a 2-core machine below saturation; 8.5 is a real engine's step")
    parser.add_argument("--engine-instances", type=int, default=2)
    parser.add_argument("--replay-native", action="store_true",
                        help="the replay engine as a C++ backend (as NVIDIA's, it costs the pipeline no Python)")
    parser.add_argument("--replay-sender-threads", type=int, default=1)
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="streamed tokens per engine response after the first (1: every token)")
    parser.add_argument("--engine-max-batch-size", type=int, default=128)
    parser.add_argument("--postprocessing-instances", type=int, default=2)
    parser.add_argument("--bls-instances", type=int, default=1)
    parser.add_argument("--gateway-workers", type=int, default=1, help="tritonforge openai --workers")
    parser.add_argument("--gateway-model", choices=(ENSEMBLE_MODEL, BLS_MODEL), default=DEFAULT_MODEL,
                        help="the model the gateway calls (tritonforge openai --model); compared with the ensemble")
    parser.add_argument("--load-processes", type=int, default=1,
                        help="processes generating the load, for both paths alike")
    parser.add_argument("--tool", choices=("python", "perf_analyzer"), default="python",
                        help="load generator for both paths (--load-processes applies to python)")
    parser.add_argument("--name", default="gateway-cpu")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if args.load_processes < 1:
        parser.error(f"--load-processes must be at least 1, got {args.load_processes}")
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        model = make_tiny_model(work / "model")
        serving = configs.ServingConfig(max_batch_size=max(args.concurrency),
                                        engine_instances=1 if args.replay_native else args.engine_instances,
                                        postprocessing_instances=args.postprocessing_instances,
                                        bls_instances=args.bls_instances)
        repository = build(BuildOptions(model=model, output=work / "repo", engine="replay",
                                        replay_step_ms=args.replay_step_ms, replay_native=args.replay_native,
                                        replay_sender_threads=args.replay_sender_threads,
                                        stream_interval=args.stream_interval,
                                        max_batch_size=args.engine_max_batch_size, max_input_len=64,
                                        max_seq_len=64 + args.output_tokens, serving=serving),
                           progress=lambda _: None)
        prompts = make_prompts(tokenizer_dir(repository), 256, 24)
        # Open APIs: perf_analyzer reads the model config; the ports are local to this run.
        with TritonServer(repository, restricted_apis="") as server:
            # Its own process, as in production: sharing the load generator's GIL would measure that instead.
            port = free_port()
            gateway_log = work / "gateway.log"
            with gateway_log.open("wb") as log:  # the gateway keeps its own copy of the file
                gateway = subprocess.Popen([sys.executable, "-m", "tritonforge.cli", "openai", "--url",
                                            server.grpc_url, "--port", str(port), "--workers",
                                            str(args.gateway_workers), "--model", args.gateway_model],
                                           stdout=subprocess.DEVNULL, stderr=log)
            base_url = f"http://127.0.0.1:{port}"
            try:
                wait_healthy(base_url)
            except RuntimeError:
                gateway.kill()
                sys.exit(f"the gateway did not start; its log:\n{gateway_log.read_text()[-3000:]}")
            try:
                asyncio_load(server.grpc_url, "ensemble", prompts, 4, args.output_tokens, 1)  # warm-up
                for concurrency in args.concurrency:
                    for path in ("ensemble", "gateway"):
                        row = measure_point(path, concurrency, args, prompts, server.grpc_url, base_url,
                                            gateway.pid, work)
                        rows.append(row)
                        print(f"{concurrency:4} {path:9} {row['output_tokens_per_s']:9,.0f} tok/s  TTFT p50 "
                              f"{row['ttft_ms_p50']} ms  errors {row['errors']}", file=sys.stderr, flush=True)
            finally:
                gateway.terminate()
                gateway.wait(timeout=30)
    by_point = {(r["concurrency"], r["path"]): r for r in rows}
    for row in rows:
        base = by_point[(row["concurrency"], "ensemble")]["output_tokens_per_s"]
        row["ratio"] = round(row["output_tokens_per_s"] / base, 3) if base else None
    meta = {"machine": machine_description(), "date": datetime.date.today().isoformat(),
            "replay_step_ms": args.replay_step_ms, "output_tokens": args.output_tokens,
            "gateway_workers": args.gateway_workers, "gateway_model": args.gateway_model,
            "load_processes": args.load_processes, "tool": args.tool,
            "duration_s": args.duration_s}
    lines = [f"OpenAI gateway vs the ensemble over gRPC — {meta['machine']}, {meta['date']}, replay engine "
             f"{args.replay_step_ms} ms a step, {args.output_tokens} tokens a request, load: {args.tool}, "
             f"the gateway calls {args.gateway_model} ({args.gateway_workers} workers)", "",
             "| streams | path | output tokens/s | vs ensemble | TTFT p50 / p99 ms | ITL p50 ms "
             "| at the gateway: TTFT / ITL mean ms | errors | CPU µs a chunk: load generator / gateway |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        gateway_cpu = "" if row["gateway_cpu_us_per_chunk"] is None else f" / {row['gateway_cpu_us_per_chunk']}"
        at_gateway = (f"{row['gateway_ttft_ms_mean']} / {row['gateway_itl_ms_mean']}"
                      if row.get("gateway_itl_ms_mean") is not None else "")
        lines.append(f"| {row['concurrency']} | {row['path']} | {row['output_tokens_per_s']:,.0f} | {row['ratio']} | "
                     f"{row['ttft_ms_p50']} / {row['ttft_ms_p99']} | {row['itl_ms_p50']} | {at_gateway} | "
                     f"{row['errors']} | {row['load_cpu_us_per_chunk']}{gateway_cpu} |")
    lines += ["", "- at the gateway: its own histograms (its /metrics) over the point, from a request's arrival to "
              "the first chunk it hands to the HTTP connection, and between chunks; beside the client's figures they "
              "say whether time was lost before the gateway (gRPC, server) or after it (HTTP, client)",
              "- CPU µs a chunk: CPU time over the point of the load generator's processes (and of the gateway "
              "with its workers) / streamed chunks received"]
    stem = args.results_dir / args.name
    stem.parent.mkdir(parents=True, exist_ok=True)
    with_extension(stem, ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    with_extension(stem, ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(row["errors"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
