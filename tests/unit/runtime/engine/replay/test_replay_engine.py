"""The replay engine (benchmarking only): what it streams, its batch capacity, cancellation, limits; and what the
C++ replay engine shares with it at a server's stop."""

import re
import threading

import pytest

from tritonforge.facts.errors import ErrorKind, RequestError
from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.engine.generation import GenerationRequest, TopTokens
from tritonforge.runtime.engine.replay.engine import ReplayEngine

TOKENS = list(range(10, 50))
WAIT_S = 60


class Sink:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log
        self.done, self.streamed, self.result, self.tops, self.error = threading.Event(), [], None, [], None

    def scheduled(self):
        pass

    def tokens(self, ids, log_probs, top=None):
        self.streamed += ids
        self.tops += top or []
        self.log.append(("token", self.name))

    def finish(self, result, error):
        self.error = error
        self.result = result
        self.log.append(("finish", self.name))
        self.done.set()

    def cancelled(self):
        return False


@pytest.fixture()
def engine():
    engine = ReplayEngine(TOKENS, step_ms=2, limits=EngineLimits(max_batch_size=2, max_input_len=8, max_seq_len=64),
                          vocab_size=100)
    yield engine
    engine.shutdown()


def submit(engine, name, log, prompt, max_new_tokens, stream=True):
    sink = Sink(name, log)
    request = GenerationRequest(request_id=name, prompt_ids=prompt, max_new_tokens=max_new_tokens, sink=sink,
                                stream=stream)
    engine.validate(request)
    engine.submit(request)
    return sink


def test_streams_the_preset_tokens_from_an_offset_set_by_the_prompt(engine):
    log = []
    sink = submit(engine, "a", log, [3, 4], 45)
    assert sink.done.wait(WAIT_S)
    expected = [TOKENS[(7 + i) % len(TOKENS)] for i in range(45)]
    # The last token comes with finish only, so the response carrying it can be flagged final.
    assert sink.streamed == expected[:-1] and sink.result.token_ids == expected
    assert sink.result.finish_reason == "length"


def test_requests_beyond_the_batch_capacity_wait_for_a_free_slot(engine):
    log = []
    sinks = [submit(engine, name, log, [1], 5) for name in "abc"]
    assert all(sink.done.wait(WAIT_S) for sink in sinks)
    first_token_of_c = log.index(("token", "c"))
    assert ("finish", "a") in log[:first_token_of_c] and ("finish", "b") in log[:first_token_of_c]


def test_cancel_by_request_id_ends_the_stream(engine):
    log = []
    sink = submit(engine, "a", log, [1], 60)
    engine.cancel("a")
    assert sink.done.wait(WAIT_S) and sink.result.finish_reason == "cancelled"
    assert len(sink.streamed) < 60


class CancelsOnItsFirstToken(Sink):
    """Cancels its request by id from its first token on: by then the request is running, not waiting."""

    def __init__(self, name, log, engine):
        super().__init__(name, log)
        self.engine = engine

    def tokens(self, ids, log_probs):
        super().tokens(ids, log_probs)
        self.engine.cancel(self.name)


def test_a_running_request_cancelled_by_its_id_ends_at_the_next_step(engine):
    sink = CancelsOnItsFirstToken("a", [], engine)
    request = GenerationRequest(request_id="a", prompt_ids=[1], max_new_tokens=60, sink=sink, stream=True)
    engine.validate(request)
    engine.submit(request)
    assert sink.done.wait(WAIT_S) and sink.result.finish_reason == "cancelled"
    assert len(sink.streamed) == 1


@pytest.mark.parametrize("prompt, max_new_tokens, field", [
    ([], 4, "input_ids"), ([1] * 9, 4, "input_ids"), ([1], 0, "request_output_len"), ([1], 64, "request_output_len"),
    ([100], 4, "input_ids"),
])
def test_engine_limits_are_enforced(engine, prompt, max_new_tokens, field):
    with pytest.raises(RequestError) as error:
        submit(engine, "x", [], prompt, max_new_tokens)
    assert error.value.field == field


def test_the_likeliest_tokens_are_fixed_values_the_recorded_one_certain(engine):
    """A recording has no distribution: each token comes with log prob 0 and the ids after it as alternatives at
    OpenAI's log prob of the impossible, streamed and in the result alike."""
    sink = Sink("top", [])
    request = GenerationRequest(request_id="top", prompt_ids=[1], max_new_tokens=3, sink=sink, stream=True,
                                return_log_probs=True, num_top_log_probs=3)
    engine.validate(request)
    engine.submit(request)
    assert sink.done.wait(WAIT_S) and sink.error is None
    expected = [TopTokens([t, (t + 1) % 100, (t + 2) % 100], [0.0, -9999.0, -9999.0]) for t in sink.result.token_ids]
    assert sink.result.top == expected
    assert sink.tops == expected[:len(sink.tops)] and sink.tops


def test_instances_share_one_batch_through_the_lock_file(tmp_path):
    import subprocess
    import sys

    from tritonforge.runtime.engine.replay.engine import SharedBatch

    path = str(tmp_path / "batch.lock")
    mine = SharedBatch(path, slots=3)
    assert [mine.acquire(), mine.acquire()] == [0, 1]
    # Another process (another instance's stub) gets only the slot left, and its slots die with it.
    other = ("import sys; from tritonforge.runtime.engine.replay.engine import SharedBatch; "
             "b = SharedBatch(sys.argv[1], 3); "
             "print(b.acquire(), b.acquire())")
    result = subprocess.run([sys.executable, "-c", other, path], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["2", "None"]
    assert mine.acquire() == 2  # freed when that process exited
    assert mine.acquire() is None
    mine.release(1)
    assert mine.acquire() == 1
    mine.close()
    assert not (tmp_path / "batch.lock").exists()  # the last to close removes the file it created


def test_requests_open_when_the_engine_shuts_down_end_unavailable():
    """A model unloading under open requests: they end with an error another server can take over (503)."""
    engine = ReplayEngine(TOKENS, step_ms=2, limits=EngineLimits(max_batch_size=1, max_input_len=8, max_seq_len=64),
                          vocab_size=100)
    errors, ended = [], threading.Event()

    class Ended(Sink):
        def finish(self, result, error):
            errors.append(error)
            if len(errors) == 2:
                ended.set()

    for name in ("running", "waiting"):  # one slot: the second waits in the queue
        request = GenerationRequest(request_id=name, prompt_ids=[1], max_new_tokens=60, sink=Ended(name, []))
        engine.submit(request)
    engine.shutdown()
    assert ended.wait(WAIT_S)
    assert all(error.kind is ErrorKind.UNAVAILABLE for error in errors), errors


def test_the_engine_stats_count_a_running_sequence_with_its_prompt(engine):
    """What the metrics gauges read (EngineMetrics): after the first step of a request of 3 prompt tokens,
    4 tokens are in its KV cache and it runs."""
    seen = []

    class Watching(Sink):
        def tokens(self, ids, log_probs):
            super().tokens(ids, log_probs)
            if len(self.streamed) == 2:  # in step 2, on the engine's thread: the stats step 1 left
                seen.append(engine.stats)

    sink = Watching("a", [])
    engine.submit(GenerationRequest(request_id="a", prompt_ids=[1, 2, 3], max_new_tokens=5, sink=sink, stream=True))
    assert sink.done.wait(WAIT_S)
    assert (seen[0].kv_tokens, seen[0].scheduled, seen[0].waiting) == (4, 1, 0)


def _constants(path) -> tuple[dict[str, str], dict[str, float]]:
    """A C++ source's string and seconds constants, by name."""
    source = path.read_text()
    strings = dict(re.findall(r'constexpr char (k\w+)\[\] = "([^"]*)";', source))
    seconds = {name: float(value) for name, value in re.findall(r"constexpr std::chrono::seconds (k\w+)\{(\d+)\};",
                                                                 source)}
    return strings, seconds


def test_the_cpp_models_stop_with_the_files_times_and_messages_of_the_python_ones():
    """server_stop.h (the C++ replay engine's, the BLS's and the coalescer's part in a server's stop) takes what a
    stop is made of from contract.h, generated from facts/ (the heartbeat folder's variable and files, the poll
    period, the time a model gets to end its streams, what a request still open is told); the replay engine and
    the coalescer keep one time of their own (the wait before a last error response), which must be Python's."""
    from tritonforge.builder.native import COALESCER, INCLUDE_DIR, REPLAY
    from tritonforge.builder.native_contract import header_text
    from tritonforge.facts import environment
    from tritonforge.facts.errors import ServerStopping, answered_kind
    from tritonforge.runtime import triton_adapter

    assert _constants(INCLUDE_DIR / "server_stop.h") == ({}, {})
    header = header_text()
    for name, value in (("kHeartbeatDirEnv", environment.HEARTBEAT_DIR_ENV),
                        ("kStoppingFile", environment.STOPPING_FILE), ("kServerStopping", str(ServerStopping()))):
        assert f'constexpr char {name}[] = "{value}";' in header
    assert f"constexpr int kModelDrainEndSeconds = {environment.MODEL_DRAIN_END_S};" in header
    assert answered_kind(str(ServerStopping())) is ErrorKind.UNAVAILABLE  # as a client reads the message
    strings, seconds = _constants(REPLAY.source)
    assert strings == {"kBackend": "tritonforge_replay"}  # its log lines' name, and no message of its own
    assert seconds == {"kErrorAfterResponse": triton_adapter.ERROR_AFTER_RESPONSE_S}
    assert _constants(COALESCER.source)[1] == {"kErrorAfterResponse": triton_adapter.ERROR_AFTER_RESPONSE_S}
