"""Which thread of tritonserver is busiest during a benchmark, and in which functions: run beside a benchmark
(bench/gpu_coalescer.sh does), it watches the newest tritonserver every --every-s seconds: the CPU cores of each
of its threads over --window-s (/proc/PID/task), then the busiest thread's stacks, sampled with `perf record -g`
on that thread where perf exists, else with gdb (`thread apply all bt`, the thread's own part kept). One JSON
line per look on stdout, with the time, so a look can be matched to the benchmark point it fell in.

  python3 bench/thread_stacks.py --duration-s 600 > stacks.jsonl &
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tritonforge.tools.profiling import busiest_threads, thread_cpu_snapshot  # noqa: E402


def newest_server() -> int | None:
    found = subprocess.run(["pgrep", "-n", "-x", "tritonserver"], capture_output=True, text=True).stdout.split()
    return int(found[0]) if found else None


def perf_stacks(pid: int, tid: int, seconds: float) -> collections.Counter:
    """Leaf-first call chains of `tid` (its own frames), with perf: the most sampled ones."""
    data = Path(f"/tmp/thread-stacks-{tid}.data")
    subprocess.run(["perf", "record", "-q", "-g", "-t", str(tid), "-o", str(data), "--", "sleep", str(seconds)],
                   capture_output=True, timeout=seconds + 30)
    report = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"], capture_output=True,
                            text=True, timeout=120).stdout
    chains: collections.Counter = collections.Counter()
    for sample in report.strip().split("\n\n"):
        frames = [line.split(None, 1)[1] if " " in line.strip() else line for line in sample.strip().splitlines()]
        if frames:
            chains[" <- ".join(frame.strip() for frame in frames[:8])] += 1
    data.unlink(missing_ok=True)
    return chains


def gdb_stacks(pid: int, tid: int, samples: int) -> collections.Counter:
    """Call chains of `tid`, from `samples` stops of the process by gdb."""
    chains: collections.Counter = collections.Counter()
    for _ in range(samples):
        out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 10"],
                             capture_output=True, text=True, timeout=60).stdout
        for block in re.split(r"\n(?=Thread \d+ )", out):
            if f"LWP {tid})" in block:
                frames = re.findall(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+)", block, flags=re.M)
                chains[" <- ".join(frames[:8])] += 1
    return chains


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--every-s", type=float, default=15)
    parser.add_argument("--window-s", type=float, default=2)
    parser.add_argument("--gdb-samples", type=int, default=8)
    args = parser.parse_args()
    tool = "perf" if shutil.which("perf") else "gdb" if shutil.which("gdb") else None
    print(json.dumps({"sampler": tool}), flush=True)
    deadline = time.monotonic() + args.duration_s
    while time.monotonic() < deadline:
        pid = newest_server()
        if pid is None:
            time.sleep(1)
            continue
        before = thread_cpu_snapshot(pid)
        time.sleep(args.window_s)
        threads = busiest_threads(before, thread_cpu_snapshot(pid), args.window_s, count=6)
        look = {"time": time.strftime("%H:%M:%S"), "pid": pid, "threads": threads}
        if threads and threads[0]["cores"] > 0.3 and tool is not None:
            try:
                chains = (perf_stacks(pid, threads[0]["tid"], args.window_s) if tool == "perf"
                          else gdb_stacks(pid, threads[0]["tid"], args.gdb_samples))
                look["stacks"] = chains.most_common(6)
            except (subprocess.SubprocessError, OSError) as error:
                look["stacks_error"] = str(error)
        print(json.dumps(look), flush=True)
        time.sleep(max(0.0, args.every_s - args.window_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
