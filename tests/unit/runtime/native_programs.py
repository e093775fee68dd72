"""The C++ under test, compiled here: libraries that the differential tests load beside their Python twins, and
programs that drive a header or a backend without Triton. Each is built with the sanitizers where SANITIZE_ENV is
set: tests/unit/builder/test_native_checks.py runs those modules again so, the sanitizers' runtimes preloaded."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from tritonforge.builder import native

SANITIZE_ENV = "TRITONFORGE_TEST_SANITIZE"
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]
# A program's flags: what the checks hold every backend to, at a level that keeps the sanitizers' reports exact.
PROGRAM_FLAGS = ["-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror"]


def _sanitize() -> list[str]:
    return SANITIZE_FLAGS if os.environ.get(SANITIZE_ENV) else []


def compile_library(source: Path, library: Path) -> Path:
    """`source` compiled as the build compiles a backend (native.COMPILE_FLAGS), into `library`."""
    completed = subprocess.run([native.compiler(), *native.COMPILE_FLAGS, *_sanitize(), f"-I{native.INCLUDE_DIR}",
                                "-o", str(library), str(source)], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    return library


def compile_program(sources: Iterable[Path], program: Path, *, include_dirs: Iterable[Path] = (),
                    libraries: Iterable[str] = ()) -> Path:
    """`sources` compiled and linked into `program`, the floor (runtime/native) and `include_dirs` searched; the
    test skips, naming what is missing, where no compiler is."""
    compiler = native.compiler()
    if compiler is None:
        pytest.skip("needs a C++ compiler (g++, c++ or $CXX) to build the C++ under test")
    completed = subprocess.run([compiler, *PROGRAM_FLAGS, *_sanitize(), f"-I{native.INCLUDE_DIR}",
                                *(f"-I{folder}" for folder in include_dirs), *map(str, sources), "-o", str(program),
                                *libraries], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    return program
