"""The C++ replay backend's error paths (runtime/engine/replay/replay_backend.cc), which no real server can be made
to take: the backend compiled into one program with a test double of Triton's backend API
(native/fake_triton_api.cc) and a driver (native/replay_driver.cc) that calls it as Triton would, one scenario a
run, and prints the outcome of each call and what the backend did through the API, one line each."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tritonforge.builder import native

from ..native_programs import compile_program

NATIVE = Path(__file__).parent / "native"
SOURCES = [native.REPLAY.source, NATIVE / "fake_triton_api.cc", NATIVE / "replay_driver.cc"]
TOKENS = [11, 12, 13, 14, 15]
OFFSET = 3  # the driver's prompt, [1, 2], starts every request's tokens at this offset into TOKENS
TOKEN_FILE = "tokens.json"
# What every run must leave: no thread of the engine's running and none of the API's objects undeleted.
LEFT_NOTHING = ["threads-left 0", "unfreed errors=0 messages=0 responses=0 factories=0"]


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    return compile_program(SOURCES, tmp_path_factory.mktemp("replay") / "replay_driver", libraries=["-ldl"])


@pytest.fixture
def repository(tmp_path) -> Path:
    """The model's folder, holding the token file as the build writes it (a JSON list of ids)."""
    (tmp_path / TOKEN_FILE).write_text(json.dumps(TOKENS))
    return tmp_path


def play(driver: Path, scenario: str, repository: Path, token_file: str = TOKEN_FILE) -> list[str]:
    completed = subprocess.run([str(driver), scenario, str(repository), token_file], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0, (completed.stdout, completed.stderr)
    return completed.stdout.splitlines()


def assert_nothing_went_amiss(out: list[str]) -> None:
    """No exception crossed the C ABI, no request was touched after its release, nothing was left behind."""
    assert not [line for line in out if " threw" in line or line.startswith(("used-after-release", "timed out"))], out
    assert out[-2:] == LEFT_NOTHING, out


def of(out: list[str], label: str) -> list[str]:
    """What the backend did with request `label`: its responses, releases and factory deletions, in order."""
    return [line for line in out if line.split()[1:2] == [label] and line.split()[0] in (
        "sent", "released", "factory-deleted", "send-flags")]


def expected_tokens(count: int) -> list[int]:
    return [TOKENS[(OFFSET + index) % len(TOKENS)] for index in range(count)]


def test_a_streaming_request_gets_one_response_a_token_the_last_final_and_its_factory_deleted(driver, repository):
    out = play(driver, "serves", repository)
    first, second, third = expected_tokens(3)
    assert of(out, "r1") == ["released r1",  # the factory outlives the request: released as soon as it is read
                             f"sent r1 more output_ids={first} sequence_length=1",
                             f"sent r1 more output_ids={second} sequence_length=1",
                             f"sent r1 final output_ids={third} sequence_length=1",
                             "factory-deleted r1"]
    assert_nothing_went_amiss(out)


def test_a_request_whose_response_factory_cannot_be_made_gets_its_error_and_is_released_once(driver, repository):
    out = play(driver, "factory-fails", repository)
    assert of(out, "r2") == ["sent r2 final error=INTERNAL fake: no response factory for r2", "released r2"], out
    assert_nothing_went_amiss(out)


def test_the_other_requests_of_its_batch_are_served_all_the_same(driver, repository):
    out = play(driver, "factory-fails", repository)
    first, second = expected_tokens(2)
    assert of(out, "r1") == ["released r1", f"sent r1 more output_ids={first} sequence_length=1",
                             f"sent r1 final output_ids={second} sequence_length=1", "factory-deleted r1"]
    assert of(out, "r3") == ["released r3", f"sent r3 final output_ids={first},{second} sequence_length=2",
                             "factory-deleted r3"]


def test_a_malformed_request_gets_its_error_as_its_final_response_and_is_released_once(driver, repository):
    out = play(driver, "bad-request", repository)
    assert of(out, "r1") == ["released r1", "sent r1 final error=INVALID_ARG request_output_len: must be >= 1",
                             "factory-deleted r1"]
    assert of(out, "r2") == ["released r2",
                             "sent r2 final error=INVALID_ARG input_ids: the replay engine reads INT32 or BOOL",
                             "factory-deleted r2"]
    assert_nothing_went_amiss(out)


def test_an_instance_whose_state_cannot_be_set_returns_that_error_and_stops_the_engine_it_made(driver, repository):
    out = play(driver, "set-state-fails", repository)
    assert "initialize error=INTERNAL fake: the instance's state cannot be set" in out, out
    # The engine's three senders (and its stop watch) ran as the state was refused; none runs after.
    [refused_with] = [int(line.split()[1]) for line in out if line.startswith("threads-at-refusal")]
    assert refused_with >= 3
    assert_nothing_went_amiss(out)


def test_a_thread_the_engine_cannot_start_is_an_error_return_and_the_threads_it_started_are_stopped(driver,
                                                                                                   repository):
    out = play(driver, "thread-fails", repository)
    initialized = [line for line in out if line.startswith("initialize")]
    assert [line.split(": ")[0] for line in initialized] == [  # a sender's thread refused, then the stop watch's
        "initialize 1-threads-allowed error=INTERNAL tritonforge_replay",
        "initialize 3-threads-allowed error=INTERNAL tritonforge_replay"], out
    assert all(": the engine could not start: " in line for line in initialized), initialized
    assert_nothing_went_amiss(out)


@pytest.mark.parametrize("text", ["[11, 12,", '{"tokens": [11]}', '[11, "12"]', "[11, 12.5]", "[11, 1e3]",
                                  "[11, 2147483648]", "[11, 99999999999999999999]", "[]", None],
                         ids=["not-json", "not-a-list", "a-string", "a-fraction", "an-exponent", "past-int32",
                              "past-int64", "empty", "missing"])
def test_a_malformed_token_file_is_an_error_return_not_an_exception(driver, repository, text):
    if text is not None:
        (repository / "bad_tokens.json").write_text(text)
    out = play(driver, "bad-token-file", repository, "bad_tokens.json")
    [initialized] = [line for line in out if line.startswith("initialize")]
    assert initialized.startswith("initialize error=INVALID_ARG tritonforge_replay: "), initialized
    assert_nothing_went_amiss(out)


def test_a_parameter_that_is_not_a_number_is_an_error_return_not_an_exception(driver, repository):
    out = play(driver, "bad-parameter", repository)
    initialized = [line for line in out if line.startswith("initialize")]
    assert len(initialized) == 6, out  # each numeric parameter once, some twice (not parsed; out of range)
    assert all(" error=INVALID_ARG tritonforge_replay: parameters " in line for line in initialized), initialized
    assert_nothing_went_amiss(out)
