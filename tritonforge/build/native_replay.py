"""The replay engine as a C++ Triton backend (benchmarking only): compiled at build time into the engine
model's version folder, where Triton looks for a model's backend library before its backend directory.

Why C++: the Python replay engine sends each token through a Python stub (~200 µs of CPU a response), so at
a real engine's ~29k tokens/s it took 6-8 of the 16 cores the pipeline runs on; NVIDIA's tensorrtllm backend
sends from C++ for a few microseconds. The source (`native/replay_backend.cc`) says what it does; it needs
a C++17 compiler and nothing of Triton's but the server that loads it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BACKEND = "tritonforge_replay"  # the config's `backend`: Triton loads libtriton_<backend>.so
LIBRARY = f"libtriton_{BACKEND}.so"
SOURCE = Path(__file__).resolve().parent / "native" / "replay_backend.cc"
COMPILE_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-pthread")


class CompilerMissing(RuntimeError):
    pass


def compile_backend(target_dir: Path) -> Path:
    """Compile the backend into `target_dir` (the engine model's version folder); return the library."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise CompilerMissing("--replay-native compiles a C++ backend and found no C++ compiler (g++, c++ or $CXX): "
                              "install one, or build without --replay-native")
    library = target_dir / LIBRARY
    completed = subprocess.run([compiler, *COMPILE_FLAGS, "-o", str(library), str(SOURCE)],
                               capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"compiling {SOURCE.name} failed ({compiler}):\n{completed.stderr.strip()}")
    return library
