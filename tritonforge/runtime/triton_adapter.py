"""The thin edge between Triton's Python backend (`pb_utils`) and the library.

model.py files pass the `pb_utils` module in, so that nothing else in tritonforge imports it and plain unit
tests reach all the logic. One place maps our exceptions to Triton error codes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..facts.environment import (
    DRAINED_SUFFIX,
    DRAINS_SUFFIX,
    HEARTBEAT_DIR_ENV,
    HEARTBEAT_PERIOD_S,
    SERVER_PID_FILE,
    STOPPING_FILE,
    stopping_deadline,
)
from ..facts.errors import ERROR_CODES, INTERNAL_PREFIX, ErrorKind, ResponseSendError, TritonforgeError

logger = logging.getLogger(__name__)

# How long a request's last response, when it is an error, waits after the request's response before it: time
# for that response to pass the ensemble's later steps (postprocessing). Triton 2.51's ensemble stops counting
# the steps of a request once one of them answers an error, so a postprocessing step still running then keeps
# the ensemble request in flight for ever: the server's stop waits its whole exit timeout for it, then cannot
# unload the ensemble and is killed (core's EnsembleContext::PrepareSteps, fixed upstream in 2026).
ERROR_AFTER_RESPONSE_S = 1.0
_STUB_WATCH = Path(__file__).with_name("stub_watch.py")


def request_inputs(request) -> dict[str, np.ndarray]:
    """Every input tensor of a request, copied out (request tensors die when execute returns)."""
    return {tensor.name(): np.array(tensor.as_numpy(), copy=True) for tensor in request.inputs()}


def is_decoupled(args: dict) -> bool:
    return bool(json.loads(args["model_config"]).get("model_transaction_policy", {}).get("decoupled", False))


def to_triton_error(pb_utils, error: Exception):
    """A client-safe TritonError: our own errors with their message and their kind's code (`ERROR_CODES`),
    anything else without internals, as INTERNAL."""
    if isinstance(error, TritonforgeError):
        return pb_utils.TritonError(str(error), getattr(pb_utils.TritonError, error.codes.triton))
    logger.error("internal error: %r", error)
    return pb_utils.TritonError(f"{INTERNAL_PREFIX}{type(error).__name__}",
                                getattr(pb_utils.TritonError, ERROR_CODES[ErrorKind.INTERNAL].triton))


def requested_outputs(request) -> frozenset[str] | None:
    """The outputs the caller asked for (None: all)."""
    return frozenset(request.requested_output_names()) or None


def output_tensors(pb_utils, outputs: dict[str, np.ndarray], requested: frozenset[str] | None = None) -> list:
    """Tensors for a response or a BLS request, only those `requested` when given.

    A response must not carry outputs its caller did not request: the 2.51 stub drops them in
    `ResponseSender.send` without holding the GIL, which crashes the stub under Python 3.12 (the Python of
    NVIDIA's containers). A Python-backend BLS call that asks for a subset of a model's outputs is such a caller.
    """
    return [pb_utils.Tensor(name, value) for name, value in outputs.items() if requested is None or name in requested]


def answer_each(pb_utils, requests, compute) -> list:
    """The responses of a non-decoupled model: `compute(inputs)` gives one request's outputs; a request
    that fails gets its own error response, and the others in the batch are still answered."""
    responses = []
    for request in requests:
        try:
            tensors = output_tensors(pb_utils, compute(request_inputs(request)), requested_outputs(request))
            responses.append(pb_utils.InferenceResponse(tensors))
        except Exception as error:  # noqa: BLE001 - one bad request must not fail the batch
            responses.append(pb_utils.InferenceResponse(error=to_triton_error(pb_utils, error)))
    return responses


class CancellationCheck:
    """Whether a request's client went away, asked of its response sender at most once per period:
    `is_cancelled()` is an IPC round trip to the server, too costly for every token."""

    def __init__(self, sender, period_s: float):
        self._sender = sender
        self._period_s = period_s
        self._next_check = 0.0
        self._cancelled = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._cancelled and now >= self._next_check:
            self._next_check = now + self._period_s
            self._cancelled = bool(self._sender.is_cancelled())
        return self._cancelled


class RequestRows:
    """One decoupled request answered row by row: the rows of a batched request run apart, and the last
    response of the last open row carries the final flag. It builds the request's responses (only the outputs
    the caller asked for) and sends them one at a time. A send never raises: it runs in threads that serve
    other requests too (the engine's, a stream's reader), so a failed send is logged and returns False, and
    the caller ends its row."""

    def __init__(self, pb_utils, sender, rows: int, requested: frozenset[str] | None, check_period_s: float,
                 on_done: Callable[[], None] = lambda: None):
        self.pb_utils, self.sender, self.rows, self.requested = pb_utils, sender, rows, requested
        self.open_rows = rows
        self.on_done = on_done  # called once, after the final response
        self.cancelled = CancellationCheck(sender, check_period_s)
        self._lock = threading.Lock()  # held through a send: no response can follow the final one
        self._errors: set[int] = set()  # the ids of the error responses made and not sent yet
        self._last_sent = -ERROR_AFTER_RESPONSE_S  # time.monotonic() of the last response sent

    def response(self, outputs: dict[str, np.ndarray]):
        return self.pb_utils.InferenceResponse(output_tensors(self.pb_utils, outputs, self.requested))

    def error_response(self, error: Exception):
        response = self.pb_utils.InferenceResponse(error=to_triton_error(self.pb_utils, error))
        self._errors.add(id(response))
        return response

    def send(self, response=None, *, row_done: bool = False) -> bool:
        """Send a row's response (None: nothing, unless it is the request's final flag); `row_done`: the row's
        last. True when sent. A row's last response that cannot be sent is replaced by an error response, so
        that the request still ends (a final flag never sent would hold the client's stream open). A last
        response that is an error goes out `ERROR_AFTER_RESPONSE_S` after the response before it, at the
        earliest."""
        with self._lock:
            if row_done:
                self.open_rows -= 1
            final = row_done and self.open_rows == 0
            if response is None and not final:
                return True
            flags = self.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
            if final and id(response) in self._errors:
                time.sleep(max(self._last_sent + ERROR_AFTER_RESPONSE_S - time.monotonic(), 0.0))
            self._errors.discard(id(response))
            try:
                if _try_send(self.sender, response, flags):
                    self._last_sent = time.monotonic()
                    return True
                if final:
                    send_final(self.pb_utils, self.sender, self.error_response(ResponseSendError()))
                elif row_done:
                    _try_send(self.sender, self.error_response(ResponseSendError()), flags)
                return False
            finally:
                if final:
                    self.on_done()


def answer_error(pb_utils, sender, error: Exception) -> None:
    """End a decoupled request with its error response, before any other response was sent."""
    send_final(pb_utils, sender, pb_utils.InferenceResponse(error=to_triton_error(pb_utils, error)))


def send_final(pb_utils, sender, response=None) -> None:
    """A request's one and final response (or the final flag alone); never raises, as `RequestRows.send`, and
    when the response cannot be sent the flag alone, which carries no data, still ends the request."""
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    if response is None or not _try_send(sender, response, final):
        _try_send(sender, None, final)


def _try_send(sender, response, flags: int) -> bool:
    """One send (None: the flags alone); a failure is logged and answered False."""
    try:
        if response is None:
            sender.send(flags=flags)
        else:
            sender.send(response, flags=flags)
        return True
    except Exception:  # noqa: BLE001 - the caller ends the row another way
        logger.exception("could not send a response (flags %s)", flags)
        return False


def resolve_path(args: dict, value: str) -> str:
    """A path parameter; a relative one is relative to the model's directory, so a repository mounts anywhere."""
    path = Path(value)
    return str(path if path.is_absolute() else (Path(args["model_repository"]) / path).resolve())


def start_heartbeat(drain: Callable[[float], None] | None = None) -> None:
    """Write this stub's clock (time.monotonic, one clock for the whole machine) into the supervisor's folder
    every second, from a thread that needs the GIL: a stub that stops running Python (a stopped process, a
    call stuck holding the GIL) stops writing, even where other instances of its model still answer. Nothing
    happens where no supervisor asked for it (no folder in the environment).

    A stub whose server is gone (killed, with or without the `tritonforge serve` that started it) ends: Triton
    2.51's stub then waits for ever in some states, holding its memory and shared-memory region. A process of
    its own watches for that (`stub_watch.py`: a thread of the stub can be kept from running by one stuck with
    the GIL); this thread checks its parent too, where that process could not start. And with `drain`, it
    calls `drain(deadline)` once the server is stopping (`STOPPING_FILE`), then says it is drained."""
    folder = os.environ.get(HEARTBEAT_DIR_ENV)
    if not folder:
        return
    path = Path(folder) / str(os.getpid())
    stopping = Path(folder) / STOPPING_FILE
    server = os.getppid()
    if _launched_server(Path(folder)) not in (None, server):
        os._exit(1)  # the server died while this stub loaded: its parent now is whoever adopted it
    _watch_server(server)
    if drain is not None:
        path.with_suffix(DRAINS_SUFFIX).touch()

    def beat() -> None:
        nonlocal drain
        fresh = path.with_suffix(".tmp")
        while True:
            if os.getppid() != server:
                os._exit(1)  # nothing is left to serve; no cleanup could reach a server that is gone
            deadline = _deadline(stopping) if drain is not None else None
            if deadline is not None:
                drain(deadline)
                drain = None
                path.with_suffix(DRAINED_SUFFIX).touch()
            try:
                fresh.write_text(repr(time.monotonic()))
                os.replace(fresh, path)  # readers never see a half-written time
            except OSError:  # the folder went with its server: keep watching for the server's end above
                pass
            time.sleep(HEARTBEAT_PERIOD_S)

    threading.Thread(target=beat, daemon=True, name="tritonforge-heartbeat").start()


def _watch_server(server: int) -> subprocess.Popen | None:
    """Start the process that ends this stub once `server` is gone (stub_watch.py), with the interpreter this
    stub embeds (the launcher puts it first on PATH); None where there is none to run it with."""
    python = sys.executable if sys.executable and os.access(sys.executable, os.X_OK) else shutil.which("python3")
    if python is None:
        logger.warning("no Python interpreter to watch the server with: the heartbeat thread watches it alone")
        return None
    return subprocess.Popen([python, "-I", "-S", str(_STUB_WATCH), str(server), str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _launched_server(folder: Path) -> int | None:
    """The pid of the server the launcher started (SERVER_PID_FILE), None where it did not say."""
    try:
        return int((folder / SERVER_PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def _deadline(stopping: Path) -> float | None:
    try:
        return stopping_deadline(stopping.read_text())
    except (OSError, UnicodeDecodeError):  # not stopping (the launcher writes the file whole, with a rename)
        return None
