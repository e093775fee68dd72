"""Where a request's time to first token goes inside tritonserver, from Triton's per-request trace.

Reads the trace files a traced run wrote (`bench/pipeline.py --trace-file FILE`: FILE.0, FILE.1, ...) and
prints, for each path, the stages between the server reading a request and sending its first response,
as the median and the 99th percentile over the traced requests, and the same stages averaged over the
slowest 5% of requests (what makes up the tail). Server-side times only: the client's TTFT adds the wire.

    python bench/trace.py /tmp/trace/t.json [--json OUT.json]
"""

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

ENSEMBLE_STAGES = (
    ("to preprocessing", "read", "pre.REQUEST_START"),
    ("preprocessing queue", "pre.QUEUE_START", "pre.COMPUTE_START"),
    ("preprocessing execution", "pre.COMPUTE_START", "pre.COMPUTE_END"),
    ("to the engine", "pre.COMPUTE_END", "engine.REQUEST_START"),
    ("engine to first response", "engine.REQUEST_START", "post.REQUEST_START"),
    ("postprocessing queue", "post.QUEUE_START", "post.COMPUTE_START"),
    ("postprocessing execution", "post.COMPUTE_START", "post.COMPUTE_OUTPUT_START"),
    ("response out of postprocessing to gRPC send", "post.COMPUTE_OUTPUT_START", "send"),
)
DIRECT_STAGES = (("engine queue", "read", "engine.COMPUTE_START"),
                 ("engine to first response sent", "engine.COMPUTE_START", "send"))
BLS_STAGES = (("BLS queue", "read", "bls.COMPUTE_START"),
              ("BLS execution (takes the request)", "bls.COMPUTE_START", "bls.COMPUTE_END"),
              ("BLS: tokenize, engine, first response sent", "bls.COMPUTE_END", "send"))
STEP_NAMES = {"preprocessing": "pre", "tensorrt_llm": "engine", "postprocessing": "post", "tensorrt_llm_bls": "bls"}


def load(trace_file: Path) -> tuple[dict, dict]:
    """Each trace's model and parent, and its timestamps by name, every occurrence kept (a decoupled request
    sends many responses)."""
    files = sorted(trace_file.parent.glob(trace_file.name + ".*")) or [trace_file]
    meta, stamps = {}, collections.defaultdict(lambda: collections.defaultdict(list))
    for file in files:
        for entry in json.loads(file.read_text()):
            if "model_name" in entry:
                meta[entry["id"]] = entry
            for stamp in entry.get("timestamps", ()):
                stamps[entry["id"]][stamp["name"]].append(stamp["ns"])
    return meta, stamps


def timelines(meta: dict, stamps: dict) -> dict[str, list[dict]]:
    """Per path, one dict a traced request: moment name -> ns, the server's read as `read`, its first
    response sent as `send`."""
    children = collections.defaultdict(list)
    for trace_id, entry in meta.items():
        if "parent_id" in entry:
            children[entry["parent_id"]].append(trace_id)
    paths = collections.defaultdict(list)
    for trace_id, entry in meta.items():
        if "parent_id" in entry:
            continue
        own = stamps[trace_id]
        # Streamed requests only: a non-streamed one (the expected answers) sends once, at its end.
        if len(own.get("GRPC_SEND_START", ())) < 2 or not own.get("REQUEST_START"):
            continue
        moments = {"read": min(own.get("GRPC_WAITREAD_END", own["REQUEST_START"])), "send": min(own["GRPC_SEND_START"])}
        model = entry["model_name"]
        if model == "ensemble":
            path = "ensemble"
            steps = collections.defaultdict(list)
            for child in children[trace_id]:
                steps[STEP_NAMES.get(meta[child]["model_name"], "?")].append(stamps[child])
            if not all(steps.get(name) for name in ("pre", "engine", "post")):
                continue
            # The first response's postprocessing request is the first to start.
            steps["post"].sort(key=lambda s: min(s["REQUEST_START"]))
            for name in ("pre", "engine", "post"):
                moments.update({f"{name}.{key}": min(values) for key, values in steps[name][0].items()})
        elif model == "tensorrt_llm":
            # The BLS names its engine requests with a uuid's 32 hex digits; perf_analyzer numbers its own.
            path = "bls engine calls" if len(entry.get("request_id", "")) == 32 else "direct"
            moments.update({f"engine.{key}": min(values) for key, values in own.items()})
        elif model == "tensorrt_llm_bls":
            path = "bls"
            moments.update({f"bls.{key}": min(values) for key, values in own.items()})
        else:
            continue
        paths[path].append(moments)
    return paths


def stage_figures(requests: list[dict], stages) -> dict:
    usable = [r for r in requests if all(a in r and b in r for _, a, b in stages)]
    if not usable:
        return {}
    total = np.array([r["send"] - r["read"] for r in usable]) / 1e6
    slowest = np.argsort(total)[-max(1, len(usable) // 20):]
    figures = {"requests": len(usable), "stages": []}
    for name, start, end in (*stages, ("read to first response sent", "read", "send")):
        values = np.array([r[end] - r[start] for r in usable]) / 1e6
        figures["stages"].append({"stage": name, "p50_ms": round(float(np.percentile(values, 50)), 3),
                                  "p99_ms": round(float(np.percentile(values, 99)), 3),
                                  "slowest_5pct_mean_ms": round(float(values[slowest].mean()), 3)})
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_file", type=Path)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    paths = timelines(*load(args.trace_file))
    if not paths:
        print(f"no traced request with a response in {args.trace_file}*", file=sys.stderr)
        return 1
    result = {}
    for path, stages in (("direct", DIRECT_STAGES), ("ensemble", ENSEMBLE_STAGES), ("bls", BLS_STAGES),
                         ("bls engine calls", DIRECT_STAGES)):
        figures = stage_figures(paths.get(path, []), stages)
        if not figures:
            continue
        result[path] = figures
        print(f"\n{path}: {figures['requests']} traced requests, ms (server read to first response sent)")
        print("| stage | p50 | p99 | mean of the slowest 5% |\n|---|---:|---:|---:|")
        for row in figures["stages"]:
            print(f"| {row['stage']} | {row['p50_ms']} | {row['p99_ms']} | {row['slowest_5pct_mean_ms']} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
