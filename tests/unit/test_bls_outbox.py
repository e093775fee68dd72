"""The BLS's streamed-text outbox: text that arrives while a chunk is being sent goes out next, as one
chunk, in order; the stream's end waits for the send in flight. And the shape of the BLS's responses."""

import threading

from tritonforge.runtime.bls.orchestrator import BlsOrchestrator, _Senders, _StreamOutbox

from tritonforge.runtime.triton_adapter import RequestRows

from .test_engine_thread_faults import PB_UTILS_STAND_IN, Sender

WAIT_S = 5


class SlowCompletion:
    """The request's rows (RequestRows' stand-in): a send blocks until released, like a send that waits on the
    server, and says it was sent."""

    def __init__(self):
        self.sent: list = []
        self.sending = threading.Event()
        self.release = threading.Event()

    def send(self, response):
        self.sending.set()
        assert self.release.wait(WAIT_S)
        self.sent.append(response)
        return True


def test_text_arriving_during_a_send_goes_out_next_as_one_chunk_in_order():
    senders, completion = _Senders(2), SlowCompletion()
    outbox = _StreamOutbox(senders, completion, lambda text, tokens: (text, tokens))
    try:
        outbox.add("The ", 1)
        assert completion.sending.wait(WAIT_S)  # "The " is on its way
        for piece, tokens in (("quick ", 1), ("brown ", 2), ("fox", 1)):
            outbox.add(piece, tokens)
        completion.release.set()
        assert outbox.drain() == ("", 0)  # returns once the sender let go: nothing is left
        assert completion.sent == [("The ", 1), ("quick brown fox", 4)]
    finally:
        senders.shutdown()


def test_drain_hands_back_what_no_sender_took():
    senders, completion = _Senders(1), SlowCompletion()
    outbox = _StreamOutbox(senders, completion, lambda text, tokens: (text, tokens))
    completion.release.set()
    try:
        outbox.add("a", 1)
        assert outbox.drain() == ("", 0) and completion.sent == [("a", 1)]
        outbox.text, outbox.tokens = ["tail"], 2  # as if added after the last send, with no sender scheduled
        assert outbox.drain() == ("tail", 2)
    finally:
        senders.shutdown()


class FailingCompletion:
    """Rows whose sends fail (the stub out of shared memory): RequestRows logs and answers False."""

    def __init__(self):
        self.tried: list = []

    def send(self, response):
        self.tried.append(response)
        return False


def test_a_chunk_that_cannot_be_sent_marks_the_stream_failed():
    """The stream's reader then ends it with an error; a client must never get text with a silent gap."""
    senders = _Senders(1)
    completion = FailingCompletion()
    outbox = _StreamOutbox(senders, completion, lambda text, tokens: (text, tokens))
    try:
        outbox.add("lost", 1)
        outbox.drain()
        assert outbox.send_failed
        outbox.add("after", 1)  # no chunk follows a lost one: nothing more is tried, nothing left for the end
        assert outbox.drain() == ("", 0) and completion.tried == [("lost", 1)]
    finally:
        senders.shutdown()


def test_a_response_sums_its_log_probs_and_only_a_batched_requests_responses_carry_their_row():
    """As NVIDIA's BLS answers: `cum_log_probs` is the sum of the response's log probs, `batch_index` only
    where the request has several rows."""
    bls = BlsOrchestrator.__new__(BlsOrchestrator)  # building a response reads nothing of the orchestrator
    rows = RequestRows(PB_UTILS_STAND_IN, Sender(), 1, None, check_period_s=1.0)
    alone = dict(bls._response(rows, "Hi", 0, 1, [-0.5, -0.25], {}, 2).tensors)
    assert alone["text_output"].tolist() == [b"Hi"] and "batch_index" not in alone
    assert alone["cum_log_probs"].item() == -0.75 and alone["output_log_probs"].shape == (1, 1, 2)
    assert alone["num_output_tokens"].item() == 2
    batched = dict(bls._response(rows, "Hi", 1, 2, None, {}, None).tensors)
    assert batched["batch_index"].item() == 1 and "cum_log_probs" not in batched
