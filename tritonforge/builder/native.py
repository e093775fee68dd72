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

import contextlib
import functools
import hashlib
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .. import runtime
from ..facts.environment import tritonforge_cache_dir

RUNTIME = Path(runtime.__file__).resolve().parent
INCLUDE_DIR = RUNTIME / "native"
COMPILE_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-pthread")
KEY_DIGITS = 32  # hex digits of the sha256 that name a compiled backend in the cache: 128 bits


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
    """Compile `backend` into `target_dir` (its model's version folder); return the library. A library compiled
    before from the same preprocessed source, by the same compiler with the same flags, is copied from the cache
    instead (a compile takes 3-8 s a backend, a build compiles up to three)."""
    found = compiler()
    if not found:
        raise CompilerMissing(f"{backend.flag} compiles a C++ backend and found no C++ compiler (g++, c++ or $CXX): "
                              f"install one, or build without {backend.flag}")
    library = target_dir / backend.library
    command = [found, *COMPILE_FLAGS, f"-I{INCLUDE_DIR}"]
    key = _compile_key(found, command, backend.source)
    if key is None:  # the source does not preprocess: the compile says why
        _compile(command, backend.source, library)
        return library
    cached = native_cache_dir() / f"{key}-{backend.library}"
    if cached.is_file():
        shutil.copyfile(cached, library)
        return library
    _compile(command, backend.source, library)
    _keep(library, cached)
    return library


def native_cache_dir() -> Path:
    """Where compiled backends are kept, each named by the key of what it was compiled from."""
    return tritonforge_cache_dir() / "native"


def _compile(command: list[str], source: Path, library: Path) -> None:
    completed = subprocess.run([*command, "-o", str(library), str(source)], capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"compiling {source.name} failed ({command[0]}):\n{completed.stderr.strip()}")


@functools.cache
def _compiler_version(compiler_path: str) -> str:
    return subprocess.run([compiler_path, "--version"], capture_output=True, text=True).stdout


def _compile_key(compiler_path: str, command: list[str], source: Path) -> str | None:
    """The sha256 of the compiler's identity, the flags and the source as the compiler sees it, every header it
    includes expanded (`-E -P`: no line markers, so the same code found in another folder has the same key); None
    where the source does not preprocess (the compile then says why)."""
    expanded = subprocess.run([*command, "-E", "-P", str(source)], capture_output=True)
    if expanded.returncode != 0:
        return None
    digest = hashlib.sha256()
    for part in (compiler_path, _compiler_version(compiler_path), *command[1:]):
        digest.update(part.encode() + b"\0")
    digest.update(expanded.stdout)
    return digest.hexdigest()[:KEY_DIGITS]


def _keep(library: Path, cached: Path) -> None:
    """A copy of `library` in the cache, written whole under a name of its own and then renamed into place; a cache
    that cannot be written (a read-only home) only costs the next build a compile."""
    partial = cached.with_name(f".{cached.name}.{os.getpid()}-{secrets.token_hex(4)}")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, partial)
        os.replace(partial, cached)
    except OSError:
        with contextlib.suppress(OSError):  # nothing was written where the cache's folder cannot be
            partial.unlink(missing_ok=True)
