"""The C++ held to what the compiler and the sanitizers can tell: every native source compiles without a warning
under -Wall -Wextra -Werror, and the differential tests of the C++ text (detokenizer, streamed text) and sending
rules (outbox.h) against their Python twins, and the replay backend's error paths driven through a test double of
Triton's API, pass again with the C++ built under AddressSanitizer and UndefinedBehaviorSanitizer."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tritonforge.builder import native

from ..runtime.native_programs import SANITIZE_ENV

pytestmark = pytest.mark.skipif(native.compiler() is None,
                                reason="needs a C++ compiler (g++, c++ or $CXX) to check the C++ sources")

SOURCES = sorted(native.RUNTIME.rglob("*.cc"))
ROOT = Path(__file__).resolve().parents[3]
DIFFERENTIAL_TESTS = ["tests/unit/runtime/text/test_native_detokenizer.py",
                      "tests/unit/runtime/text/test_native_streaming_text.py",
                      "tests/unit/runtime/test_native_outbox.py",
                      "tests/unit/runtime/test_native_json.py",
                      "tests/unit/runtime/engine/test_replay_error_paths.py"]


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


def test_the_backends_check_the_backend_api_of_the_server_they_are_tested_on():
    """backend_support.h's kApiMajor.kApiMinor is the TRITONBACKEND API of the Triton the suite runs (2.51, the
    oldest the project serves on): every C++ backend refuses an older one as it loads."""
    import re

    libraries = sorted(Path(sys.prefix).rglob("libtritonserver*.so"))
    if not libraries:
        pytest.skip("needs libtritonserver (the nvidia-pytriton wheel's Triton 2.51)")
    # In a process of its own: the library finds the libraries beside it through LD_LIBRARY_PATH alone.
    ask = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); a, b = ctypes.c_uint32(), ctypes.c_uint32(); "
           "lib.TRITONBACKEND_ApiVersion(ctypes.byref(a), ctypes.byref(b)); print(a.value, b.value)")
    answer = subprocess.run([sys.executable, "-c", ask, str(libraries[0])], capture_output=True, text=True, check=True,
                            env={**os.environ, "LD_LIBRARY_PATH": str(libraries[0].parent)})
    major, minor = (int(value) for value in answer.stdout.split())
    support = (native.INCLUDE_DIR / "backend_support.h").read_text()
    declared = {name: int(value) for name, value in re.findall(r"constexpr uint32_t (kApiM\w+) = (\d+);", support)}
    assert declared == {"kApiMajor": major, "kApiMinor": minor}
    for kind in (native.BLS, native.COALESCER, native.REPLAY, native.POSTPROCESSING):
        assert "TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) { return backend::CheckApiVersion(" in (
            kind.source.read_text()), kind.source.name
