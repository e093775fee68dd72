"""The coalescer's folding rules (runtime/engine/coalescer/coalescing.h), without Triton: which of an engine's
streamed responses fold into one and how each output folds, through a small driver compiled here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tritonforge.builder import native

from ..native_programs import compile_program

pytestmark = pytest.mark.skipif(native.compiler() is None,
                                reason="needs a C++ compiler (g++, c++ or $CXX) to build the coalescer's rules")

DRIVER = Path(__file__).parent / "native" / "coalescing_driver.cc"


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    return compile_program([DRIVER], tmp_path_factory.mktemp("coalescing") / "driver",
                           include_dirs=[native.RUNTIME / "engine" / "coalescer"])


def folded(driver: Path, fold: bool, *responses: str, top: int = 0) -> list[str]:
    text = f"fold {int(fold)}\ntop {top}\n" + "\n".join(responses) + "\n"
    return subprocess.run([str(driver)], input=text, capture_output=True, text=True, check=True).stdout.splitlines()


def test_a_streams_new_tokens_fold_into_one_response_appended_summed_and_latest(driver):
    out = folded(driver, True, "R 0 0 1 1 10", "R 0 0 1 1 11", "R 0 0 1 2 12")
    # ids appended, lengths summed, log probs appended, cum_log_probs the latest, context logits kept from the first
    assert out == ["R 0 0 1,1,4, | 10 11 12 13 | 4 | -1 -1.1 -1.2 -1.3 | 12 | 1 | 3"]


def test_each_tokens_likeliest_alternatives_fold_with_their_tokens(driver):
    out = folded(driver, True, "R 0 0 1 1 10", "R 0 0 1 2 11", top=2)
    fields = out[0].split(" | ")
    assert fields[1] == "10 11 12" and fields[7:] == ["1,1,3,2,", "1000 1001 1100 1101 1200 1201",
                                                       "-0 -1 -0 -1 -0 -1"]


def test_beams_are_never_folded_they_stream_whole(driver):
    out = folded(driver, True, "R 0 0 2 1 10", "R 0 0 2 2 10")
    assert [line.split(" |")[0] for line in out] == ["R 0 0 1,2,1,", "R 0 0 1,2,2,"]


def test_returned_sequences_and_rows_fold_each_on_their_own_in_their_order(driver):
    out = folded(driver, True, "R 0 0 1 1 10", "R 0 1 1 1 20", "R 0 0 1 1 11", "R 0 1 1 1 21", "R 1 0 1 1 30")
    assert [line.split(" | ")[:2] for line in out] == [
        ["R 0 0 1,1,2,", "10 11"], ["R 0 1 1,1,2,", "20 21"], ["R 1 0 1,1,1,", "30"]]


def test_nothing_folds_across_an_error_and_the_error_keeps_its_place(driver):
    out = folded(driver, True, "R 0 0 1 1 10", "E the engine failed", "R 0 0 1 1 11")
    assert [line[:9] for line in out] == ["R 0 0 1,1", "E the eng", "R 0 0 1,1"]


def test_a_request_that_does_not_stream_new_tokens_passes_every_response_as_it_came(driver):
    out = folded(driver, False, "R 0 0 1 1 10", "R 0 0 1 1 11")
    assert len(out) == 2 and all(line.endswith("| 1") for line in out)
