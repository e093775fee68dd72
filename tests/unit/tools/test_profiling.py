"""CPU accounting of process trees, as the benchmarks read it from /proc."""

import subprocess
import sys
import time

from tritonforge.tools.profiling import cpu_snapshot, tree_cpu_seconds

# A parent that starts a child burning 0.5 s of CPU, then both wait: the CPU is the grandchild's alone.
_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass\\ntime.sleep(60)"])
child.wait()
"""


def test_a_tree_counts_the_cpu_of_its_descendants():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT])
    try:
        deadline = time.monotonic() + 30
        while tree_cpu_seconds(parent.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = tree_cpu_seconds(parent.pid)
        assert tree >= 0.4
        # By part: the root ("tritonserver") burnt almost nothing, its descendants the rest. CPU time only
        # grows, so the parts read now hold at least what the tree held a moment ago (summed directly: taking
        # this process's large total back off would lose the ticks to rounding).
        by_part = cpu_snapshot(parent.pid)
        tree_parts = sum(seconds for part, seconds in by_part.items() if part != "load generator")
        assert by_part["tritonserver"] < 0.4 and tree_parts >= tree - 1e-9
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
