"""Liveness probes of a running server's Python models: is a stub that is alive still answering?

A stub can stay alive and answer nothing (a deadlock, a stopped process, a call that never returns): its
requests then hang while every process check passes. So the supervisor asks each Python model of the
repository for a cheap answer every `period_s`, each model in its own thread, and calls a model wedged when
its probe has had no answer for `wedged_after_s`. An error is an answer: a dead stub is the process
check's business. The probes cost the engine nothing:

- preprocessing and postprocessing: a one-token request;
- the engine (decoupled): a `stop` for a request id no one uses; the Python engines answer it from their
  engine thread, so an engine step stuck in a call is found too, not only a stuck stub;
- the BLS (decoupled): a request with `max_tokens` 0, refused by the BLS itself before it calls the engine.

A model deployed non-decoupled (`--no-streaming`) has no stream to probe it with and is not probed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..clients.client import grpc_tensors, one_streamed_answer
from ..facts.contract import (
    BLS_MODEL,
    ENGINE_MODEL,
    MAX_TOKENS,
    POST_SEQUENCE_LENGTH,
    POST_TOKENS_BATCH,
    POSTPROCESSING_MODEL,
    PRE_QUERY,
    PRE_REQUEST_OUTPUT_LEN,
    PREPROCESSING_MODEL,
    TEXT_INPUT,
    stop_request_inputs,
)

logger = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 5.0
DEFAULT_WEDGED_AFTER_S = 30.0

# model → (decoupled, inputs as name → array)
_PROBES = {
    PREPROCESSING_MODEL: (False, {PRE_QUERY: np.array([[b"ping"]], dtype=np.object_),
                                  PRE_REQUEST_OUTPUT_LEN: np.array([[1]], dtype=np.int32)}),
    POSTPROCESSING_MODEL: (False, {POST_TOKENS_BATCH: np.zeros((1, 1, 1), dtype=np.int32),
                                   POST_SEQUENCE_LENGTH: np.ones((1, 1), dtype=np.int32)}),
    ENGINE_MODEL: (True, stop_request_inputs()),
    BLS_MODEL: (True, {TEXT_INPUT: np.array([[b"ping"]], dtype=np.object_),
                       MAX_TOKENS: np.array([[0]], dtype=np.int32)}),
}


def probed_models(repository, models) -> list[str]:
    """The models among `models` (names of running Python models) that have a probe: the probe's transaction
    policy must be the model's own, read from its config in `repository`."""
    chosen = []
    for model in sorted(set(models) & set(_PROBES)):
        config = mc.ModelConfig()
        text_format.Parse((repository / model / "config.pbtxt").read_text(), config)
        if config.model_transaction_policy.decoupled == _PROBES[model][0]:
            chosen.append(model)
    return chosen


class ProbeTimeout(Exception):
    pass


def probe(url: str, model: str, timeout_s: float) -> None:
    """One probe of `model`; raises ProbeTimeout when it has no answer in `timeout_s`."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    decoupled, arrays = _PROBES[model]
    inputs = grpc_tensors(grpcclient, arrays)
    client = grpcclient.InferenceServerClient(url)
    try:
        if not decoupled:
            try:
                client.infer(model, inputs, client_timeout=timeout_s)
            except InferenceServerException as error:
                if "Deadline" in str(error):
                    raise ProbeTimeout(model) from None
            return
        try:  # each probe's one answer is its final response; an error answer is an answer too
            one_streamed_answer(client, model, inputs, f"liveness-{uuid.uuid4().hex}", timeout_s)
        except queue.Empty:
            raise ProbeTimeout(model) from None
    finally:
        client.close()


class LivenessProbes:
    """Probes `models` of the server at `url` until `stop()`; `wedged()` names those that stopped answering."""

    def __init__(self, url: str, models: list[str], *, period_s: float = DEFAULT_PERIOD_S,
                 wedged_after_s: float = DEFAULT_WEDGED_AFTER_S):
        self.url = url
        self.models = models
        self.period_s = period_s
        self.wedged_after_s = wedged_after_s
        self._asked: dict[str, float | None] = dict.fromkeys(models)  # when the unanswered probe was sent
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(model,), daemon=True, name=f"probe-{model}")
                         for model in models]

    def start(self) -> LivenessProbes:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def wedged(self) -> list[str]:
        now = time.monotonic()
        return [model for model, asked in self._asked.items()
                if asked is not None and now - asked >= self.wedged_after_s]

    def _run(self, model: str) -> None:
        while not self._stop.is_set():
            self._asked[model] = time.monotonic()
            try:
                probe(self.url, model, self.wedged_after_s)
            except ProbeTimeout:
                return  # stays unanswered: wedged() reports it until the supervisor restarts the server
            except Exception as error:  # noqa: BLE001 - a server going away is the process check's business
                logger.debug("probe of %s: %r", model, error)
            self._asked[model] = None
            self._stop.wait(self.period_s)
