"""One `tritonforge serve`: the supervised tritonserver, the OpenAI gateway beside it where asked, the signals that
stop them, and the stop's time budget (the server's open streams first, then the gateway's last events within what
is left of --exit-timeout-s)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .options import ServeOptions
from .server import RESTRICTED_APIS, TritonServer
from .supervisor import Supervisor

GATEWAY_END_S = 2.0  # once the server is gone, how long the gateway gets at least to send its streams' last events


@dataclass(frozen=True)
class GatewaySettings:
    """What the repository tells the gateway: the tool-call format its model writes, its LoRA adapters."""

    tool_parser: str
    adapters: dict[str, int] = field(default_factory=dict)


class ServeSession:
    """`run` serves until a signal: the first SIGINT or SIGTERM stops cleanly within the exit timeout, another
    kills the server's process group at once; while the server still loads, a signal interrupts the start (which
    stops what it started). `say` takes the session's lines for the terminal."""

    def __init__(self, repository: Path, options: ServeOptions, *, models: list[str], world_size: int,
                 gateway: GatewaySettings | None, say: Callable[[str], None]):
        self.repository, self.options, self.models, self.say = repository, options, models, say
        self.gateway_settings = gateway
        self.server = TritonServer(repository, executable=options.tritonserver, http_port=options.http_port,
                                   grpc_port=options.grpc_port, metrics_port=options.metrics_port,
                                   address=options.address, log_verbose=options.log_verbose, world_size=world_size,
                                   restricted_apis="" if options.open_apis else RESTRICTED_APIS,
                                   log_file=options.log_file, exit_timeout_s=options.exit_timeout_s)
        self.supervisor = Supervisor(self.server, wedged_after_s=options.wedged_after_s)
        self.stop = threading.Event()  # set by the first signal once serving
        self.serving = threading.Event()
        self.stopping_since: float | None = None
        self.gateway = None

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.say(f"starting tritonserver on {self.repository} ({', '.join(self.models)}); loading takes a few "
                 f"seconds to minutes ...")
        self.supervisor.start()
        self.serving.set()
        try:
            if self.gateway_settings is not None:
                self._start_gateway()
            server = self.server
            print(f"serving {self.repository}: HTTP {server.http_url}, gRPC {server.grpc_url}; log {server.log_path}",
                  flush=True)
            self.say("this terminal is the server's now: send requests from a second terminal "
                     "(tritonforge generate \"Hello\"); Ctrl-C stops it")
            self.supervisor.run(self.stop)  # restarts the server when it or a stub dies; stops it on the way out
        finally:
            self.server.stop()  # already stopped by run(), unless the gateway could not start
            if self.gateway is not None:  # its streams ended with the server: it gets what is left of the budget
                self.gateway.stop(self._gateway_budget())
        self.say("tritonserver stopped")

    def _on_signal(self, *_) -> None:
        if not self.serving.is_set():
            raise KeyboardInterrupt
        if self.stop.is_set() and self.server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.pid, signal.SIGKILL)
            return
        self.stopping_since = time.monotonic()
        self.stop.set()
        self.say(f"stopping tritonserver: open streams get up to {self.server.drain_s:g} s to finish; it exits "
                 f"within {self.server.exit_timeout_s:g} s (--exit-timeout-s) (Ctrl-C again: stop at once)")

    def _start_gateway(self) -> None:
        from ..gateway.options import GatewayThread, api_key_from_environment

        options, settings = self.options, self.gateway_settings
        self.gateway = GatewayThread(self.server.grpc_url, host=options.address, port=options.openai_port,
                                     model=options.openai_model, served_model_name=options.served_model_name,
                                     api_key=api_key_from_environment(options.api_key),
                                     tool_parser=options.tool_parser or settings.tool_parser,
                                     reasoning_parser=options.reasoning_parser, adapters=settings.adapters).start()
        # At a stop the gateway takes no new request while the server's open ones finish.
        threading.Thread(target=lambda: (self.stop.wait(), self.gateway.stop_accepting()), name="gateway-stop",
                         daemon=True).start()
        adapters = "".join(f", LoRA adapter {name!r}" for name in settings.adapters)
        print(f"OpenAI API: {self.gateway.base_url}/v1 (model {options.served_model_name!r} → "
              f"{options.openai_model}{adapters})")

    def _gateway_budget(self) -> float:
        """What is left of the exit timeout since the stop began (GATEWAY_END_S at least)."""
        if self.stopping_since is None:
            return GATEWAY_END_S
        return max(self.options.exit_timeout_s - (time.monotonic() - self.stopping_since), GATEWAY_END_S)
