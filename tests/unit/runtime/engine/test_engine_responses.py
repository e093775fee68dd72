"""What the engine model answers, shaped as the tensorrtllm backend's responses, through `EngineService` and the
replay engine (its tokens: a slice of the replayed ids starting at the prompt's sum): which outputs a response
carries, the prompt echoed or not, the requests a deployment refuses, and rows cut short by a stopping server."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.unit.runtime.engine.test_engine_thread_faults import PB_UTILS_STAND_IN, WAIT_S, Request, Sender
from tritonforge.facts.contract import stop_request_inputs
from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.engine.generation import GenerationResult
from tritonforge.runtime.engine.replay.engine import ReplayEngine
from tritonforge.runtime.engine.service import EngineService, EngineSettings, _RowSink, checkpoint_bos_token_id
from tritonforge.runtime.sending import Senders
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.runtime.triton_adapter import RequestRows

PROMPT = [1, 2]
REPLAYED = list(range(10, 50))  # the prompt's sum, 3, starts its answer at 13


def make_service(*, decoupled: bool = True, exclude_input_in_output: bool = True,
                 max_seq_len: int = 64) -> EngineService:
    limits = EngineLimits(max_batch_size=4, max_input_len=8, max_seq_len=max_seq_len)
    engine = ReplayEngine(REPLAYED, step_ms=2, limits=limits, vocab_size=100)
    return EngineService(PB_UTILS_STAND_IN, EngineSettings(limits=limits, decoupled=decoupled, response_lanes=0,
                                                           exclude_input_in_output=exclude_input_in_output), engine)


@pytest.fixture()
def service():
    service = make_service()
    yield service
    service.shutdown()


def inputs(tokens: int, *, stream: bool = False, **extra) -> dict:
    return {"input_ids": np.array([PROMPT], np.int32), "input_lengths": np.array([[len(PROMPT)]], np.int32),
            "request_output_len": np.array([[tokens]], np.int32), "streaming": np.array([[stream]]),
            **{name: np.asarray(value) for name, value in extra.items()}}


def answer(service, request_inputs: dict, request_id: str = "r") -> list[dict]:
    """The request's responses' tensors, once its final response came; an error response as {"error": ...}."""
    sender = Sender()
    service.handle(Request(request_id, sender, inputs=request_inputs))
    assert sender.final.wait(WAIT_S)
    return [{"error": response.error} if response.error else dict(response.tensors) for response, _ in sender.sent]


def error_of(service, request_inputs: dict, request_id: str = "r"):
    (response,) = answer(service, request_inputs, request_id)
    return response["error"]


def test_a_whole_answer_echoes_the_prompt_unless_the_request_or_the_model_excludes_it():
    keeps = make_service(exclude_input_in_output=False)
    try:
        (echoed,) = answer(keeps, inputs(3))
        (excluded,) = answer(keeps, inputs(3, exclude_input_in_output=[[True]]))
    finally:
        keeps.shutdown()
    assert echoed["output_ids"].reshape(-1).tolist() == [*PROMPT, 13, 14, 15]
    assert echoed["sequence_length"].tolist() == [[5]]
    assert excluded["output_ids"].reshape(-1).tolist() == [13, 14, 15]


def test_token_counts_and_log_probs_come_only_when_asked_for(service):
    (plain,) = answer(service, inputs(3))
    assert set(plain) == {"output_ids", "sequence_length"}
    (counted,) = answer(service, inputs(3, return_num_input_tokens=[[True]], return_num_output_tokens=[[True]],
                                        return_log_probs=[[True]]))
    assert counted["num_input_tokens"].tolist() == [[len(PROMPT)]] and counted["num_output_tokens"].tolist() == [[3]]
    assert counted["output_log_probs"].shape == (1, 1, 3) and counted["cum_log_probs"].shape == (1, 1)


def test_each_streamed_response_counts_the_whole_prompt_and_its_own_tokens(service):
    responses = answer(service, inputs(4, stream=True, return_num_input_tokens=[[True]],
                                       return_num_output_tokens=[[True]]))
    assert [r["num_input_tokens"].item() for r in responses] == [len(PROMPT)] * len(responses)
    assert sum(r["num_output_tokens"].item() for r in responses) == 4


def test_only_a_batched_requests_responses_carry_their_rows_batch_index(service):
    (single,) = answer(service, inputs(2))
    assert "batch_index" not in single
    batched = inputs(2)
    batched.update(input_ids=np.array([PROMPT, PROMPT], np.int32), input_lengths=np.array([[2], [2]], np.int32),
                   request_output_len=np.array([[2], [2]], np.int32), streaming=np.array([[False], [False]]))
    assert sorted(r["batch_index"].item() for r in answer(service, batched)) == [0, 1]


def test_a_model_deployed_not_decoupled_refuses_streaming_and_batched_requests():
    service = make_service(decoupled=False)
    try:
        streaming = error_of(service, inputs(2, stream=True))
        batched = inputs(2)
        batched.update(input_ids=np.array([PROMPT, PROMPT], np.int32), input_lengths=np.array([[2], [2]], np.int32),
                       request_output_len=np.array([[2], [2]], np.int32), streaming=np.array([[False], [False]]))
        batch = error_of(service, batched)
    finally:
        service.shutdown()
    assert streaming.code == batch.code == "INVALID_ARG"
    assert streaming.message.startswith("stream: ") and batch.message.startswith("input_ids: ")


class _RequestingOutputs(Request):
    def __init__(self, sender, outputs):
        super().__init__("r", sender, inputs=inputs(2))
        self._outputs = outputs

    def requested_output_names(self):
        return self._outputs


def test_a_request_that_does_not_ask_for_output_ids_and_sequence_length_is_refused(service):
    sender = Sender()
    service.handle(_RequestingOutputs(sender, ["output_ids"]))
    assert sender.final.wait(WAIT_S)
    (response, _), = sender.sent
    assert response.error.code == "INVALID_ARG" and response.error.message.startswith("outputs: ")


def test_a_stop_without_a_request_id_is_refused_rather_than_stopping_others(service):
    error = error_of(service, stop_request_inputs(), request_id="")
    assert error.code == "INVALID_ARG" and error.message.startswith("stop: ")


def test_rows_cut_short_by_a_stopping_server_end_unavailable_and_at_once():
    service = make_service(max_seq_len=100_000)  # a row that would stream for minutes
    sender = Sender()
    try:
        service.handle(Request("long", sender, inputs=inputs(90_000, stream=True)))
        service.drain(time.monotonic())  # no time left for open requests
        assert sender.final.is_set()  # drain returned because the row ended, not because it gave up waiting
    finally:
        service.shutdown()
    last, _ = sender.sent[-1]
    assert last.error is not None and last.error.code == "UNAVAILABLE"
    assert len(sender.sent) < 90_000


def test_a_stopping_server_lets_a_row_that_ends_in_the_time_it_gives_finish_whole():
    service = make_service(max_seq_len=200)
    sender = Sender()
    try:
        service.handle(Request("short", sender, inputs=inputs(100, stream=True)))  # 100 steps of 2 ms
        service.drain(time.monotonic() + WAIT_S)  # time enough for it
        assert sender.final.is_set()
    finally:
        service.shutdown()
    assert not service.server_stopping.is_set()
    assert all(response.error is None for response, _ in sender.sent)
    assert sum(dict(response.tensors)["sequence_length"].item() for response, _ in sender.sent) == 100


class CancellingSender(Sender):
    """A client that goes away once it got three responses."""

    def is_cancelled(self):
        return len(self.sent) >= 3


def test_a_client_that_goes_away_midway_stops_its_row_long_before_its_end():
    """The service asks the sender whether its client went away every `cancellation_check_period_ms` (100 ms),
    a period in milliseconds: 5000 tokens take 10 s of 2 ms steps."""
    service = make_service(max_seq_len=10_000)
    sender = CancellingSender()
    try:
        service.handle(Request("gone", sender, inputs=inputs(5000, stream=True)))
        assert sender.final.wait(WAIT_S)
    finally:
        service.shutdown()
    assert len(sender.sent) < 5000


class HeldSenders:
    """Senders (a test double of `sending.Senders`) that send nothing until told: the sends a busy server has
    not taken yet. `run` gives the held rows their turns as a sender does, until none wants another."""

    def __init__(self):
        self.held = []

    def schedule(self, outbox):
        self.held.append(outbox)

    def run(self):
        while self.held:
            outbox = self.held.pop(0)
            if outbox.take_turn():
                self.held.append(outbox)


def row_sink(sender: Sender, *, senders=None, stream: bool = True, exclude_input: bool = True,
             return_perf_metrics: bool = False, stream_interval: int = 1, bos_token_id: int | None = None) -> _RowSink:
    """One row's sink, asking for log probs; its sends run on `senders` (held, or at once by default)."""
    row = SimpleNamespace(stream=stream, exclude_input=exclude_input, prompt_ids=PROMPT, return_log_probs=True,
                          num_top_log_probs=0, return_num_input_tokens=False, return_num_output_tokens=False,
                          return_perf_metrics=return_perf_metrics)
    state = RequestRows(PB_UTILS_STAND_IN, sender, 1, None, check_period_s=1.0)
    senders = senders if senders is not None else Senders(0, depth=1, name="test-send")
    return _RowSink(state, row, 0, threading.Event(), senders, stream_interval, bos_token_id)


def streaming_sink(senders: HeldSenders, sender: Sender, *, stream_interval: int = 1,
                   bos_token_id: int | None = None) -> _RowSink:
    return row_sink(sender, senders=senders, stream_interval=stream_interval, bos_token_id=bos_token_id)


def streamed(sender: Sender) -> list[tuple[list[int], list[float], bool]]:
    def tensors(response):
        return dict(response.tensors)

    return [(tensors(r)["output_ids"].reshape(-1).tolist(), tensors(r)["output_log_probs"].reshape(-1).tolist(),
             flags == 1) for r, flags in sender.sent]


def test_tokens_that_come_while_a_rows_send_waits_for_a_sender_join_that_send():
    senders, sender = HeldSenders(), Sender()
    sink = streaming_sink(senders, sender)
    for token in (13, 14, 15):
        sink.tokens([token], [-0.5])
    assert len(senders.held) == 1  # one send queued for the three tokens
    senders.run()
    sink.tokens([16], [-0.25])  # the row's send is done: this token goes out on its own
    senders.run()
    sink.tokens([17], [-0.5])
    sink.finish(GenerationResult([13, 14, 15, 16, 17, 18], [-0.5] * 6, "length"), None)
    senders.run()
    assert streamed(sender) == [([13, 14, 15], [-0.5] * 3, False), ([16], [-0.25], False),
                                ([17], [-0.5], False), ([18], [-0.5], True)]


def test_a_stream_interval_still_waits_for_its_tokens_and_the_last_response_takes_the_rest():
    senders, sender = HeldSenders(), Sender()
    sink = streaming_sink(senders, sender, stream_interval=3)
    sink.tokens([13], [0.0])  # the first token at once
    senders.run()
    sink.tokens([14], [0.0])
    sink.tokens([15], [0.0])
    assert senders.held == []  # two of three: nothing queued yet
    sink.tokens([16], [0.0])
    sink.tokens([17], [0.0])  # joins the queued send
    sink.finish(GenerationResult([13, 14, 15, 16, 17], [0.0] * 5, "length"), None)
    senders.run()
    assert [(ids, final) for ids, _, final in streamed(sender)] == [([13], False), ([14, 15, 16, 17], False),
                                                                   ([], True)]


def test_a_streamed_chunk_that_could_not_be_sent_ends_the_row_with_an_error_not_a_stream_with_a_gap():
    senders, sender = HeldSenders(), Sender(fail_at=2)
    sink = streaming_sink(senders, sender)
    sink.tokens([13], [0.0])
    senders.run()
    sink.tokens([14], [0.0])  # its send raises: the client would miss token 14
    senders.run()
    assert sink.cancelled()  # the engine stops the row
    sink.finish(GenerationResult([13, 14, 15], [0.0] * 3, "length"), None)
    senders.run()
    (first, _), (last, flags) = sender.sent
    assert dict(first.tensors)["output_ids"].reshape(-1).tolist() == [13]
    assert flags == 1 and last.error is not None and "could not be sent" in last.error.message


def test_a_generated_bos_heading_a_streamed_chunk_goes_alone_so_postprocessing_keeps_the_next_words_space():
    senders, sender = HeldSenders(), Sender()
    sink = streaming_sink(senders, sender, bos_token_id=1)
    sink.tokens([13], [-0.5])
    senders.run()
    for token in (1, 1, 5, 1):  # joined in one send: the BOS run heads it, the last BOS does not
        sink.tokens([token], [-0.25])
    senders.run()
    sink.tokens([1], [-0.5])
    sink.finish(GenerationResult([13, 1, 1, 5, 1, 1, 7], [-0.5, *[-0.25] * 4, -0.5, -0.5], "length"), None)
    senders.run()
    assert [(ids, final) for ids, _, final in streamed(sender)] == [
        ([13], False), ([1], False), ([1], False), ([5, 1], False), ([1], False), ([7], True)]
    assert [log_probs for _, log_probs, _ in streamed(sender)][1:4] == [[-0.25], [-0.25], [-0.25, -0.25]]


def test_the_engine_takes_its_bos_from_the_checkpoint_postprocessing_reads(tiny_models, tmp_path):
    model = tiny_models["sentencepiece"]
    assert checkpoint_bos_token_id(model) == load_tokenizer(model).bos_token_id is not None
    (tmp_path / "config.json").write_text('{"bos_token_id": null}')
    assert checkpoint_bos_token_id(str(tmp_path)) is None


def test_an_echoed_prompt_carries_log_probs_of_zero_before_the_generated_ones():
    """The prompt's tokens were given, not generated: each carries 0, so the log probs line up with output_ids."""
    sender = Sender()
    sink = row_sink(sender, stream=False, exclude_input=False)
    sink.finish(GenerationResult([13, 14, 15], [-0.5, -0.25, -0.125], "length"), None)
    assert streamed(sender) == [([*PROMPT, 13, 14, 15], [0.0, 0.0, -0.5, -0.25, -0.125], True)]
    assert dict(sender.sent[0][0].tensors)["cum_log_probs"].item() == -0.875  # the generated tokens' sum


def test_a_rows_perf_metrics_are_the_moments_of_its_own_events(monkeypatch):
    """Arrival, scheduling, first and last token each at their own moment (a scripted clock; the last tokens
    come with the finish)."""
    from tritonforge.runtime.engine import service as engine_service

    clock = iter(range(100, 200))
    monkeypatch.setattr(engine_service, "_now_ns", lambda: next(clock))
    senders, sender = HeldSenders(), Sender()
    sink = row_sink(sender, senders=senders, return_perf_metrics=True)  # arrives at 100
    sink.scheduled()  # 101
    sink.tokens([13], [-0.5])  # 102
    senders.run()
    sink.tokens([14], [-0.25])  # 103
    senders.run()
    sink.finish(GenerationResult([13, 14, 15, 16], [-0.5, -0.25, -0.125, -0.0625], "length"), None)  # 104
    senders.run()
    last = dict(sender.sent[-1][0].tensors)
    times = [last[name].item() for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                            "last_token_time_ns")]
    assert times == [100, 101, 102, 104]
