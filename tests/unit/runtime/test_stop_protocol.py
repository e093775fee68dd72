"""The STOPPING file's one format (facts/environment.py): what the launcher writes, the Python models read and the
C++ models read (server_stop.h, through a driver compiled here) alike, and every other text means no stop yet."""

import subprocess

import pytest

from tritonforge.builder import native
from tritonforge.facts.environment import stopping_deadline, stopping_text
from tritonforge.runtime.triton_adapter import _deadline

from .native_programs import compile_program

DRIVER = native.RUNTIME.parents[1] / "tests" / "unit" / "runtime" / "engine" / "native" / "stopping_driver.cc"
# The launcher's texts, and texts no launcher writes: a float, no newline, two lines, a sign, spaces, a number
# past int64, other digits, nothing.
TEXTS = [stopping_text(12345.678901234), stopping_text(0.5), "0\n", "1.5\n", "12345", "12\n\n", "-3\n", "+3\n",
         " 3\n", "3 \n", "9" * 20 + "\n", "٣\n", "", "\n", "inf\n", "nan\n"]


def test_the_launchers_text_reads_back_as_its_deadline():
    assert stopping_text(12345.678901234) == "12345678901234\n"
    assert stopping_deadline(stopping_text(12345.678901234)) == pytest.approx(12345.678901234, abs=1e-9)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return compile_program([DRIVER], tmp_path_factory.mktemp("stopping") / "stopping_driver")


@pytest.mark.parametrize("text", TEXTS)
def test_python_and_cpp_read_every_text_alike(driver, tmp_path, text):
    path = tmp_path / "stopping"
    path.write_text(text)
    python = _deadline(path)
    assert python == stopping_deadline(text)
    cpp = subprocess.run([str(driver), str(path)], capture_output=True, text=True, check=True).stdout.strip()
    assert cpp == ("none" if python is None else str(round(python * 1e9)))
    assert (python is None) == (text not in TEXTS[:3])
