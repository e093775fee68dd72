"""Where the time goes during a benchmark point: CPU by process and Triton's per-model statistics.

- CPU: seconds of CPU each part used during the point, read from /proc (Linux): tritonserver itself, each
  model's Python stubs (grouped by the model directory in the stub's command line), and the load generator
  (this process and the children it waited for, e.g. perf_analyzer). Divided by the wall time it is cores.
- Threads of tritonserver: seconds of CPU each of its threads used during the point (/proc/PID/task), the
  busiest named: a serial section of Triton's shows as one thread near 1.0 core.
- Triton statistics (`/v2/models/stats` over gRPC): per model, requests, executions (so the mean batch
  of an execution), and the mean time a request spent queued and in the model's execute.
- Python stacks (`record_stubs`, when py-spy is installed): one stub of each model sampled during a point,
  written as collapsed stacks (`py-spy record --format raw`), and the functions that held most samples.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections import Counter
from pathlib import Path

from ..serve.processes import children as _children
from ..serve.processes import process_group as _group
from ..serve.processes import stub_pids

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def _tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds used so far by `root` and each of its descendants that is still running, by pid."""
    used: dict[int, float] = {}
    pending = [root] if Path(f"/proc/{root}").exists() else []
    while pending:
        pid = pending.pop()
        try:
            used[pid] = _cpu_seconds(pid)
        except OSError:  # exited between the listing and the read
            continue
        pending.extend(_children(pid))
    return used


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by a process and its running descendants (e.g. a server and its workers)."""
    return sum(_tree_cpu(root).values())


def cpu_snapshot(server_pid: int | None) -> dict[str, float]:
    """CPU seconds used so far, by part: the server's process tree, and this process with its waited children."""
    totals: dict[str, float] = {}
    for pid, seconds in (_tree_cpu(server_pid) if server_pid is not None else {}).items():
        try:
            name = "tritonserver" if pid == server_pid else _group(pid)
        except OSError:  # exited since
            continue
        totals[name] = totals.get(name, 0.0) + seconds
    own = resource.getrusage(resource.RUSAGE_SELF)
    totals["load generator"] = own.ru_utime + own.ru_stime + waited_children_cpu_seconds()
    return totals


def thread_cpu_snapshot(pid: int | None) -> dict[int, tuple[str, float]]:
    """CPU seconds used so far by each thread of `pid`, by thread id, with the thread's name."""
    threads: dict[int, tuple[str, float]] = {}
    task = Path(f"/proc/{pid}/task")
    if pid is None or not task.is_dir():
        return threads
    for entry in task.iterdir():
        try:
            text = (entry / "stat").read_text()
        except OSError:  # ended between the listing and the read
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        threads[int(entry.name)] = (name, (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS)
    return threads


def busiest_threads(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall_s: float,
                    count: int = 4) -> list[dict]:
    """The `count` threads that kept most of a core busy between two snapshots: tid, name, cores."""
    if wall_s <= 0:
        return []
    busy = [{"tid": tid, "name": name, "cores": round((seconds - before.get(tid, (name, 0.0))[1]) / wall_s, 2)}
            for tid, (name, seconds) in after.items()]
    return sorted(busy, key=lambda thread: -thread["cores"])[:count]


def waited_children_cpu_seconds() -> float:
    """CPU seconds of this process's children that have exited and been waited for (e.g. perf_analyzer)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def cpu_cores(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """Cores each part kept busy between two snapshots."""
    if wall_s <= 0:
        return {}
    return {name: round((after[name] - before.get(name, 0.0)) / wall_s, 2) for name in sorted(after)}


def model_statistics(url: str) -> dict[str, dict[str, int]]:
    """Cumulative counters per model: requests, executions, queue and compute nanoseconds; {} where the
    server restricts its statistics API (`tritonforge serve` does unless --open-apis)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(as_json=True)
    except InferenceServerException:
        return {}
    finally:
        client.close()
    counters = {}
    for model in stats.get("model_stats", []):
        inference = model.get("inference_stats", {})
        counters[model["name"]] = {
            "requests": int(inference.get("success", {}).get("count", 0)),
            "executions": int(model.get("execution_count", 0)),
            "queue_ns": int(inference.get("queue", {}).get("ns", 0)),
            "compute_ns": sum(int(inference.get(part, {}).get("ns", 0))
                              for part in ("compute_input", "compute_infer", "compute_output")),
        }
    return counters


def statistics_delta(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per model over a point: requests, mean requests per execution, mean queue and compute µs per request."""
    delta = {}
    for name, now in after.items():
        then = before.get(name, {})
        requests = now["requests"] - then.get("requests", 0)
        if requests <= 0:
            continue
        executions = now["executions"] - then.get("executions", 0)
        delta[name] = {
            "requests": requests,
            "batch": round(requests / executions, 2) if executions else None,
            "queue_us": round((now["queue_ns"] - then.get("queue_ns", 0)) / requests / 1000, 1),
            "compute_us": round((now["compute_ns"] - then.get("compute_ns", 0)) / requests / 1000, 1),
        }
    return delta


def record_stubs(server_pid: int, seconds: float, out_dir: Path, tag: str) -> list[subprocess.Popen]:
    """Start py-spy on one stub of each model for `seconds`; returns the recorders (wait on them)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    recorders = []
    for model, pid in stub_pids(server_pid).items():
        output = out_dir / f"{tag}-{model}.txt"
        recorders.append(subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", "200",
             "--format", "raw", "--nonblocking", "--output", str(output)],
            stdout=subprocess.DEVNULL, stderr=open(out_dir / f"{tag}-{model}.log", "w")))
    return recorders


def top_functions(collapsed: Path, count: int = 8) -> list[tuple[str, float]]:
    """The functions whose own code held the most samples (leaf frames), as shares of all samples."""
    leaves: Counter = Counter()
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, samples = line.rpartition(" ")
        if stack and samples.isdigit():
            leaves[stack.split(";")[-1]] += int(samples)
    total = sum(leaves.values()) or 1
    return [(frame, round(samples / total, 3)) for frame, samples in leaves.most_common(count)]
