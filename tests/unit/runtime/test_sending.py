"""The coalescing sender (tritonforge/runtime/sending.py) that the engine service and the BLS send through: pieces
that come while a row's send waits or is in flight go out next, as one send, in order; the last step runs after
every send before it; a failed send ends the row's sending; the queue is bounded; closing sends what it holds."""

import threading

import pytest

from tritonforge.runtime.sending import Outbox, Senders

WAIT_S = 10  # far beyond any hand-off between two threads here: past it the test hung
# How long a thread that must stay blocked is given to (wrongly) go on before the test says it did not.
STILL_BLOCKED_S = 0.3


class SlowSend:
    """A send that waits until released, as one that waits on a busy server; records what it sent."""

    def __init__(self):
        self.sent: list[list] = []
        self.sending = threading.Event()
        self.release = threading.Event()

    def __call__(self, pieces: list) -> bool:
        self.sending.set()
        assert self.release.wait(WAIT_S)
        self.sent.append(pieces)
        return True


class Ending:
    """A row's last step: records what it got and when it ran."""

    def __init__(self):
        self.rest: list | None = None
        self.done = threading.Event()

    def __call__(self, rest: list) -> None:
        self.rest = rest
        self.done.set()


@pytest.fixture()
def senders():
    senders = Senders(2, depth=8, name="test-send")
    yield senders
    senders.close(WAIT_S)


def test_pieces_that_come_during_a_send_go_out_next_as_one_send_in_order(senders):
    send, ending = SlowSend(), Ending()
    outbox = Outbox(senders, send)
    outbox.add("The ")
    assert send.sending.wait(WAIT_S)  # "The " is on its way
    for piece in ("quick ", "brown ", "fox"):
        outbox.add(piece)
    outbox.end(ending)
    assert not ending.done.wait(STILL_BLOCKED_S)  # the last step waits for the send in flight
    send.release.set()
    assert ending.done.wait(WAIT_S)
    assert send.sent == [["The "], ["quick ", "brown ", "fox"]] and ending.rest == []


def test_pieces_under_the_interval_wait_and_the_last_step_gets_those_left():
    sent, ending = [], Ending()
    outbox = Outbox(Senders(0, depth=1, name="test-send"), lambda pieces: sent.append(pieces) or True, interval=3)
    outbox.add("a")  # the first piece goes at once
    outbox.add("b")
    outbox.add("c")  # two units of three: they wait
    assert sent == [["a"]]
    outbox.add("de", size=2)  # four units: sent
    outbox.add("f")
    outbox.end(ending)
    assert sent == [["a"], ["b", "c", "de"]] and ending.rest == ["f"]


def test_a_send_that_fails_marks_the_row_failed_and_nothing_more_of_it_is_sent():
    """The row's owner then ends it with an error: a client must never get text with a silent gap."""
    tried, ending = [], Ending()

    def refused(pieces):  # as RequestRows.send answers a send the stub could not make
        tried.append(pieces)
        return False

    outbox = Outbox(Senders(0, depth=1, name="test-send"), refused)
    outbox.add("lost")
    assert outbox.failed
    outbox.add("after")  # nothing follows a lost piece: not tried, not left for the end
    outbox.end(ending)
    assert tried == [["lost"]] and ending.rest == []


def test_a_response_or_a_last_step_that_raises_fails_its_row_and_the_sender_serves_the_next():
    senders = Senders(1, depth=4, name="test-send")  # one thread: it must outlive both failures
    try:
        def cannot_build(pieces):
            raise RuntimeError("a response that could not be built")

        def cannot_end(rest):
            raise RuntimeError("a last response that could not be built")

        broken = Outbox(senders, cannot_build)
        broken.add("x")
        broken.end(cannot_end)
        send, ending = SlowSend(), Ending()
        send.release.set()
        healthy = Outbox(senders, send)
        healthy.add("y")
        healthy.end(ending)
        assert ending.done.wait(WAIT_S)
    finally:
        senders.close(WAIT_S)
    assert broken.failed and not healthy.failed and send.sent == [["y"]]


def test_a_row_that_wants_another_send_goes_behind_the_rows_that_waited():
    """No row keeps a sender while others wait: under load each row's latency stays fair."""
    senders = Senders(1, depth=4, name="test-send")
    order, release, sending = [], threading.Event(), threading.Event()

    def send_as(name):
        def send(pieces):
            sending.set()
            assert release.wait(WAIT_S)
            order.append((name, pieces))
            return True
        return send

    try:
        first, second, ending = Outbox(senders, send_as("first")), Outbox(senders, send_as("second")), Ending()
        first.add(1)
        assert sending.wait(WAIT_S)  # the one thread now holds `first`
        first.add(2)  # `first` wants another send after this one...
        second.add(1)  # ...but `second` waited for the thread first
        second.end(ending)
        release.set()
        assert ending.done.wait(WAIT_S)
    finally:
        senders.close(WAIT_S)
    assert order == [("first", [1]), ("second", [1]), ("first", [2])]


def test_a_full_queue_makes_the_producer_wait_until_a_sender_takes_a_row():
    """A server slower than the engine slows the engine, instead of a queue without bound."""
    senders = Senders(1, depth=1, name="test-send")
    send = SlowSend()
    try:
        Outbox(senders, send).add("held")  # the thread holds this row, in its send
        assert send.sending.wait(WAIT_S)
        Outbox(senders, send).add("queued")  # the queue's one place
        added = threading.Event()
        producer = threading.Thread(target=lambda: (Outbox(senders, send).add("waits"), added.set()))
        producer.start()
        assert not added.wait(STILL_BLOCKED_S)
        send.release.set()
        assert added.wait(WAIT_S)
        producer.join(WAIT_S)
    finally:
        senders.close(WAIT_S)
    assert sorted(pieces[0] for pieces in send.sent) == ["held", "queued", "waits"]


def test_closing_sends_what_the_queue_holds_ends_the_threads_and_later_sends_run_on_the_callers_thread():
    before = set(threading.enumerate())
    senders = Senders(2, depth=8, name="test-send")
    send = SlowSend()
    for index in range(6):
        Outbox(senders, send).add(index)
    send.release.set()
    senders.close(WAIT_S)
    assert sorted(pieces[0] for pieces in send.sent) == list(range(6))
    assert [thread for thread in set(threading.enumerate()) - before if thread.is_alive()] == []
    threads = []
    Outbox(senders, lambda pieces: threads.append(threading.current_thread()) or True).add("late")
    assert threads == [threading.current_thread()]


def test_with_no_threads_every_send_runs_on_the_callers_thread():
    threads = []

    def send(pieces):
        threads.append(threading.current_thread())
        return True

    outbox = Outbox(Senders(0, depth=1, name="test-send"), send)
    outbox.add("now")
    outbox.end(lambda rest: threads.append(threading.current_thread()))
    assert threads == [threading.current_thread()] * 2


@pytest.mark.parametrize(("threads", "depth"), [(-1, 4), (2, 0)])
def test_senders_need_threads_and_a_bounded_queue(threads, depth):
    """A queue of depth 0 would be unbounded: a slow server would pile responses up instead of slowing the
    engine."""
    with pytest.raises(ValueError, match=f"^senders need threads >= 0 and depth >= 1, got {threads} and {depth}$"):
        Senders(threads, depth, name="test-send")


def test_an_outbox_needs_an_interval_of_one_or_more():
    with pytest.raises(ValueError, match="^an outbox's interval must be >= 1, got 0$"):
        Outbox(Senders(0, depth=1, name="test-send"), lambda pieces: True, interval=0)
