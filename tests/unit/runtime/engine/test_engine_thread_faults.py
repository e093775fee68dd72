"""The engine's thread and its faults, through `EngineService` (the engine model's logic).

- A response that cannot be sent ends its own request with an error; the engine's thread and every other
  request go on. The engine step's responses are sent from the engine's thread; a send that raised there
  (a stub out of shared memory, a sender already closed) used to end that thread, and with it every request
  of the engine instance: their clients waited forever.
- A `stop` is answered by the engine's thread, so an engine whose thread is stuck leaves it unanswered: the
  liveness probe (a stop for an unused id) then finds the engine wedged, where an answer from the stub alone
  would have said it was fine.
- Sender threads (responses sent off the engine's thread, `runtime/sending.py`): each row's responses in
  order, its final one last; a send stuck for one row holds only that row.

The Python backend exists only inside the server's stub, so `pb_utils` is a stand-in here with just what
`EngineService` calls; the engine is the real replay engine.
"""

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from tests.unit.pb_utils_stand_in import FINAL, PB_UTILS_STAND_IN
from tritonforge.facts.contract import OUTPUT_IDS, stop_request_inputs
from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.engine.replay.engine import ReplayEngine
from tritonforge.runtime.engine.service import EngineService, EngineSettings

WAIT_S = 60


class Sender:
    """Records what was sent; the send numbered `fail_at` (from 1) raises, as the stub's send can."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at, self.attempts, self.sent, self.final = fail_at, 0, [], threading.Event()

    def send(self, response=None, flags=0):
        self.attempts += 1
        if self.attempts == self.fail_at:
            raise RuntimeError("Failed to increase the shared memory pool size")
        self.sent.append((response, flags))
        if flags == FINAL:
            self.final.set()

    def is_cancelled(self):
        return False


def streamed_ids(sender: Sender) -> list[int]:
    """The token ids of every response a sender got, in order."""
    return [int(token) for response, _ in sender.sent for token in dict(response.tensors)[OUTPUT_IDS].ravel()]


class BlockingSender(Sender):
    """A sender whose first send waits until released, as a send stuck in the server would."""

    def __init__(self):
        super().__init__()
        self.sending, self.release = threading.Event(), threading.Event()

    def send(self, response=None, flags=0):
        self.sending.set()
        assert self.release.wait(WAIT_S)
        super().send(response, flags)


class Request:
    def __init__(self, request_id: str, sender: Sender, tokens: int = 0, inputs: dict | None = None):
        self._id, self._sender = request_id, sender
        self._inputs = inputs or {
            "input_ids": np.array([[1, 2]], np.int32), "input_lengths": np.array([[2]], np.int32),
            "request_output_len": np.array([[tokens]], np.int32), "streaming": np.array([[True]])}

    def get_response_sender(self):
        return self._sender

    def inputs(self):
        return [SimpleNamespace(name=lambda n=name: n, as_numpy=lambda v=value: v)
                for name, value in self._inputs.items()]

    def request_id(self):
        return self._id

    def requested_output_names(self):
        return []


def make_service(sender_threads: int, stream_interval: int = 1) -> EngineService:
    limits = EngineLimits(max_batch_size=4, max_input_len=8, max_seq_len=64)
    engine = ReplayEngine(list(range(10, 50)), step_ms=2, limits=limits, vocab_size=100)
    return EngineService(PB_UTILS_STAND_IN, EngineSettings(limits=limits, response_lanes=sender_threads,
                                                           stream_interval=stream_interval), engine)


@pytest.fixture(params=[0, 2], ids=["sent-by-engine-thread", "two-sender-threads"])
def service(request):
    service = make_service(request.param)
    yield service
    service.shutdown()


def test_a_failed_send_ends_its_request_with_an_error_and_the_engine_serves_on(service):
    failing, healthy = Sender(fail_at=2), Sender()
    service.handle(Request("failing", failing, tokens=20))
    service.handle(Request("healthy", healthy, tokens=20))
    assert failing.final.wait(WAIT_S) and healthy.final.wait(WAIT_S)

    last, _ = failing.sent[-1]
    assert last.error is not None and last.error.code == "INTERNAL"
    assert "could not be sent" in last.error.message
    assert len(failing.sent) < 20  # stopped after the failure, not run to the end
    # The healthy request gets, without an error, the tokens it gets alone, in order (under load, tokens that
    # come while a send waits for a sender join that send: fewer responses, the same tokens).
    assert [response.error for response, _ in healthy.sent] == [None] * len(healthy.sent)
    alone = make_service(sender_threads=0)
    try:
        reference = Sender()
        alone.handle(Request("healthy", reference, tokens=20))
        assert reference.final.wait(WAIT_S)
    finally:
        alone.shutdown()
    assert len(streamed_ids(reference)) == 20 and streamed_ids(healthy) == streamed_ids(reference)

    later = Sender()  # the engine's thread is still alive
    service.handle(Request("later", later, tokens=3))
    assert later.final.wait(WAIT_S) and later.sent[-1][0].error is None


def test_a_stop_is_answered_by_the_engine_thread_and_not_while_that_thread_is_stuck():
    service = make_service(sender_threads=0)  # the engine's thread sends, so a stuck send holds that thread
    try:
        stop_waits_for_a_stuck_engine_thread(service)
    finally:
        service.shutdown()


def stop_waits_for_a_stuck_engine_thread(service):
    idle_stop = Sender()
    service.handle(Request("nobody", idle_stop, inputs=stop_request_inputs()))
    assert idle_stop.final.wait(WAIT_S)

    stuck = BlockingSender()
    service.handle(Request("stuck", stuck, tokens=5))
    assert stuck.sending.wait(WAIT_S)  # the engine's thread is now inside that send
    stop = Sender()
    service.handle(Request("nobody", stop, inputs=stop_request_inputs()))
    assert not stop.final.wait(0.5)  # a stub that answered for itself would have by now
    stuck.release.set()
    assert stop.final.wait(WAIT_S) and stuck.final.wait(WAIT_S)


def test_a_send_stuck_for_one_row_holds_only_that_row_and_each_row_keeps_its_order():
    service = make_service(sender_threads=2)  # two sender threads: the stuck send holds one of them
    try:
        stuck, free = BlockingSender(), Sender()
        service.handle(Request("stuck", stuck, tokens=6))
        assert stuck.sending.wait(WAIT_S)
        service.handle(Request("free", free, tokens=6))
        assert free.final.wait(WAIT_S)  # the other sender sent all of it while the first send was stuck
        assert not stuck.sent
        stuck.release.set()
        assert stuck.final.wait(WAIT_S)
    finally:
        service.shutdown()
    for sender in (stuck, free):
        ids = [dict(response.tensors)["output_ids"].reshape(-1).tolist() for response, _ in sender.sent]
        assert sum(ids, []) == list(range(13, 19))  # every token once, in order (offset: the prompt's sum)
        assert [flags for _, flags in sender.sent] == [0] * (len(ids) - 1) + [FINAL]


@pytest.mark.parametrize("sender_threads", [0, 2])
def test_a_stream_interval_sends_the_first_token_at_once_then_that_many_a_response(sender_threads):
    service = make_service(sender_threads, stream_interval=3)
    try:
        sender = Sender()
        service.handle(Request("interval", sender, tokens=9))
        assert sender.final.wait(WAIT_S)
    finally:
        service.shutdown()
    ids = [dict(response.tensors)["output_ids"].reshape(-1).tolist() for response, _ in sender.sent]
    assert sum(ids, []) == list(range(13, 22))  # every token once, in order (offset: the prompt's sum)
    sizes = [len(chunk) for chunk in ids]
    if sender_threads == 0:  # sent by the engine's thread as they come: exactly the interval's pattern
        assert sizes == [1, 3, 3, 2]  # the last two go out with the final flag
    else:  # tokens that come while a send waits for a sender join it: a late sender sends more, never fewer
        assert all(size >= 3 for size in sizes[1:-1]), sizes
