"""Triton backends in C++, compiled at build time into a model's version folder, where Triton looks for a
model's backend library before its backend directory.

Why C++: a Python model sends each response through a Python stub (~200 µs of CPU a response), so at a real
engine's ~29k tokens/s the per-token models took 6-8 of the 16 cores the pipeline runs on; NVIDIA's
tensorrtllm backend sends from C++ for a few microseconds. Each source lies beside its Python twin in
`runtime/` and says what it does; they share `runtime/native/triton_backend_api.h` (the few declarations of
Triton's backend API they use) and need a C++17 compiler and nothing of Triton's but the server that loads
them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .. import runtime

RUNTIME = Path(runtime.__file__).resolve().parent
INCLUDE_DIR = RUNTIME / "native"
COMPILE_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-pthread")


@dataclass(frozen=True)
class NativeBackend:
    name: str  # the config's `backend`: Triton loads libtriton_<name>.so
    source: Path
    flag: str  # the build flag that asks for it, for the error that names a missing compiler

    @property
    def library(self) -> str:
        return f"libtriton_{self.name}.so"


# The replay engine (benchmarking only), as NVIDIA's C++ engine backend sends: one response a token.
REPLAY = NativeBackend("tritonforge_replay", RUNTIME / "engine" / "replay" / "replay_backend.cc", "--replay-native")


# The detokenizer (postprocessing) beside its Python twin, byte for byte the same text.
POSTPROCESSING = NativeBackend("tritonforge_postprocessing", RUNTIME / "text" / "native" / "postprocessing_backend.cc",
                               "--text-backend cpp")
# The BLS beside its Python twin: the same contract and text, no Python per token.
BLS = NativeBackend("tritonforge_bls", RUNTIME / "bls" / "native" / "bls_backend.cc", "--text-backend cpp")
TEXT_BACKENDS = ("python", "cpp", "auto")
# The ensemble's engine step in front of any engine: fewer, larger streamed responses under load.
COALESCER = NativeBackend("tritonforge_coalescer", RUNTIME / "engine" / "coalescer" / "coalescer_backend.cc",
                          "the coalescer")


class CompilerMissing(RuntimeError):
    pass


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def text_backend(choice: str, progress) -> str:
    """The postprocessing model's backend for `--text-backend`: "python" or the C++ backend's name (the BLS
    follows it, `bls_backend`). `auto` takes C++ where a compiler exists and says in one line when it falls back."""
    if choice == "python":
        return "python"
    if choice == "auto" and compiler() is None:
        progress("postprocessing and the BLS: no C++ compiler (g++, c++ or $CXX), so the Python models "
                 "(--text-backend python)")
        return "python"
    return POSTPROCESSING.name


def coalescer_available(wanted: bool, progress) -> bool:
    """Whether the build can wire the coalescer it was asked for; without a compiler it says so in one line."""
    if wanted and compiler() is None:
        progress("the ensemble's engine step: no C++ compiler (g++, c++ or $CXX) for the coalescer, so the engine "
                 "directly (--no-coalescer)")
        return False
    return wanted


def bls_backend(text_backend_name: str) -> str:
    """The BLS's backend for the postprocessing backend `text_backend` chose: both Python, or both C++."""
    return "python" if text_backend_name == "python" else BLS.name


def compile_backend(backend: NativeBackend, target_dir: Path) -> Path:
    """Compile `backend` into `target_dir` (its model's version folder); return the library."""
    found = compiler()
    if not found:
        raise CompilerMissing(f"{backend.flag} compiles a C++ backend and found no C++ compiler (g++, c++ or $CXX): "
                              f"install one, or build without {backend.flag}")
    library = target_dir / backend.library
    completed = subprocess.run([found, *COMPILE_FLAGS, f"-I{INCLUDE_DIR}", "-o", str(library), str(backend.source)],
                               capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"compiling {backend.source.name} failed ({found}):\n{completed.stderr.strip()}")
    return library
