"""The C++ held to what the compiler and the sanitizers can tell: every native source compiles without a warning
under -Wall -Wextra -Werror, and the differential tests of the C++ text (detokenizer, streamed text, against their
Python twins) pass again with the C++ built under AddressSanitizer and UndefinedBehaviorSanitizer."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tritonforge.builder import native

from ..runtime.text.test_native_detokenizer import SANITIZE_ENV

pytestmark = pytest.mark.skipif(native.compiler() is None,
                                reason="needs a C++ compiler (g++, c++ or $CXX) to check the C++ sources")

SOURCES = sorted(native.RUNTIME.rglob("*.cc"))
ROOT = Path(__file__).resolve().parents[3]
DIFFERENTIAL_TESTS = ["tests/unit/runtime/text/test_native_detokenizer.py",
                      "tests/unit/runtime/text/test_native_streaming_text.py"]


def test_every_backend_the_build_compiles_is_among_the_sources_checked():
    assert {backend.source for backend in (native.REPLAY, native.POSTPROCESSING, native.BLS, native.COALESCER)} \
        <= set(SOURCES)


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_each_native_source_compiles_without_a_warning(source):
    completed = subprocess.run([native.compiler(), *native.COMPILE_FLAGS, "-Wall", "-Wextra", "-Werror",
                                "-fsyntax-only", f"-I{native.INCLUDE_DIR}", str(source)],
                               capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr


def _runtime(name: str) -> str | None:
    found = subprocess.run([native.compiler(), f"-print-file-name={name}"], capture_output=True, text=True)
    path = found.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.skipif(_runtime("libasan.so") is None or _runtime("libubsan.so") is None,
                    reason="needs the compiler's libasan.so and libubsan.so (AddressSanitizer, UBSan)")
def test_the_differential_tests_pass_with_the_cpp_under_the_sanitizers():
    env = {**os.environ, SANITIZE_ENV: "1",
           "LD_PRELOAD": f"{_runtime('libasan.so')} {_runtime('libubsan.so')}",
           # Python itself leaks by design at exit: only the C++'s errors count here.
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                                *DIFFERENTIAL_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, (completed.stdout[-4000:], completed.stderr[-4000:])
    assert " passed" in completed.stdout
