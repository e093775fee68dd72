"""Soak: many streams through the ensemble and the BLS at once for minutes; nothing may be lost or leak.

Serves a tiny model's repository (the transformers engine), runs `--streams` concurrent users for
`--minutes`, half on the ensemble and half on the BLS (each user sends its next request when the last one
ends), and reports per path: requests completed, errors, TTFT and whole-request latency p50/p99; and the
resident memory (RSS) of tritonserver and of each model's Python stubs at the start and at the end.

  .venv/bin/python bench/soak.py                       # 64 streams, 10 minutes
  .venv/bin/python bench/soak.py --streams 16 --minutes 1
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.repository import tokenizer_dir
from tritonforge.facts.paths import PATH_MODELS
from tritonforge.serve.processes import all_stub_pids
from tritonforge.serve.server import TritonServer
from tritonforge.tools.benchmark import _one_request, machine_description, make_prompts, request_arrays, with_extension
from tritonforge.tools.tiny_model import make_tiny_model

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The two paths through the Python models, soaked side by side.
SOAKED_PATHS = ("ensemble", "bls")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def memory(server: TritonServer) -> dict[str, float]:
    """RSS in MiB: tritonserver, and each model's stubs summed."""
    totals = {"tritonserver": rss_mib(server.pid)}
    for pid, model in all_stub_pids(server.pid).items():
        totals[f"stub:{model}"] = round(totals.get(f"stub:{model}", 0.0) + rss_mib(pid), 1)
    return totals


async def soak(url: str, prompts, streams: int, seconds: float, output_tokens: int) -> dict[str, list]:
    import tritonclient.grpc.aio as grpc_aio

    client = grpc_aio.InferenceServerClient(url)
    deadline = time.perf_counter() + seconds
    timings: dict[str, list] = {path: [] for path in SOAKED_PATHS}

    async def user(index: int) -> None:
        path = SOAKED_PATHS[index % 2]
        sent = 0
        while time.perf_counter() < deadline:
            prompt = prompts[(index + sent * streams) % len(prompts)]
            arrays = request_arrays(path, prompt, output_tokens)
            timings[path].append(await _one_request(client, PATH_MODELS[path], arrays, output_tokens, grpc_aio))
            sent += 1

    await asyncio.gather(*(user(index) for index in range(streams)))
    await client.close()
    return timings


def figures(timings) -> dict:
    done = [t for t in timings if t.error is None and t.arrivals]
    ttft = [(t.arrivals[0] - t.sent) * 1000 for t in done]
    whole = [(t.arrivals[-1] - t.sent) * 1000 for t in done]

    def pct(values, q):
        return round(float(np.percentile(values, q)), 1) if values else None

    return {"completed": len(done), "errors": len(timings) - len(done),
            "first_error": next((t.error for t in timings if t.error), None),
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
            "latency_ms_p50": pct(whole, 50), "latency_ms_p99": pct(whole, 99)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--name", default="soak-cpu")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model = make_tiny_model(Path(work) / "model")
        repository = build(BuildOptions(model=model, output=Path(work) / "repo", max_input_len=64,
                                        max_seq_len=256, max_batch_size=min(args.streams, 32),
                                        serving=configs.ServingConfig(max_batch_size=args.streams)),
                           progress=lambda _: None)
        prompts = make_prompts(tokenizer_dir(repository), 256, 24)
        with TritonServer(repository) as server:
            asyncio.run(soak(server.grpc_url, prompts, 4, 2, args.output_tokens))  # warm-up
            start_memory = memory(server)
            started = time.perf_counter()
            timings = asyncio.run(soak(server.grpc_url, prompts, args.streams, args.minutes * 60,
                                       args.output_tokens))
            elapsed = time.perf_counter() - started
            end_memory = memory(server)
    result = {"meta": {"machine": machine_description(), "date": datetime.date.today().isoformat(),
                       "streams": args.streams, "minutes": args.minutes, "elapsed_s": round(elapsed, 1),
                       "output_tokens": args.output_tokens, "engine": "transformers (tiny model)"},
              "paths": {path: figures(t) for path, t in timings.items()},
              "rss_mib": {"start": start_memory, "end": end_memory}}
    lines = [f"Soak — {result['meta']['machine']}, {result['meta']['date']}, {args.streams} streams "
             f"(half ensemble, half BLS), {args.minutes} min, {args.output_tokens} tokens a request", "",
             "| path | completed | errors | TTFT p50 / p99 ms | latency p50 / p99 ms |", "|---|---:|---:|---:|---:|"]
    for path, row in result["paths"].items():
        lines.append(f"| {path} | {row['completed']} | {row['errors']} | {row['ttft_ms_p50']} / "
                     f"{row['ttft_ms_p99']} | {row['latency_ms_p50']} / {row['latency_ms_p99']} |")
    lines += ["", "| process | RSS MiB at start | at end |", "|---|---:|---:|"]
    for name in sorted(end_memory):
        lines.append(f"| {name} | {start_memory.get(name, '-')} | {end_memory[name]} |")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stem = args.results_dir / args.name
    with_extension(stem, ".json").write_text(json.dumps(result, indent=1) + "\n")
    with_extension(stem, ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(row["errors"] == 0 for row in result["paths"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
