"""`tritonforge openai`'s options, and the gateway run from them: in this process, in worker processes
sharing the port (`workers`), or in a background thread beside `tritonforge serve` and in tests.

The API key: `--api-key`, else $TRITONFORGE_API_KEY, so that it can come from a Kubernetes Secret.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from dataclasses import dataclass

from ..facts.contract import BLS_MODEL, ENSEMBLE_MODEL
from ..facts.environment import API_KEY_ENV
from ..facts.ports import GRPC_PORT, LOOPBACK, OPENAI_PORT, host_port, port_number
from ..facts.settings import positive_int, setting
from . import STOP_GRACE_S, GatewayFailed, stop_line
from .metrics import MULTIPROCESS_DIR_ENV, forget_worker
from .reasoning import REASONING_PARSERS
from .routes import create_app
from .serving import DEFAULT_MODEL, DEFAULT_STREAM_INTERVAL, DEFAULT_TOOL_PARSER, SERVED_MODEL_NAME
from .tool_parsers import PARSERS

FORCED_EXIT_S = 2.0  # uvicorn's way out once told to stop waiting for open connections: a tick of its loop

API_KEY_HELP = ("require 'Authorization: Bearer KEY' on every OpenAI request but GET /health (401 otherwise); "
                f"default: ${API_KEY_ENV}, no key when unset")


TOOL_PARSER_HELP = ("the format of the tool calls the model writes, read into OpenAI's tool_calls when a request "
                    "lets it choose (tool_choice auto): hermes for Hermes and Qwen models, llama3_json for Llama 3.x, "
                    "mistral for Mistral")
REASONING_PARSER_HELP = ("the format of the model's thinking, answered apart as a chat's reasoning_content: qwen3 "
                         "(thinks only when it opens <think>), deepseek_r1 (thinks from its first token to </think>); "
                         "default: none")


def api_key_from_environment(explicit: str | None = None) -> str | None:
    """The API key the gateway requires: the one given, else $TRITONFORGE_API_KEY; None (or empty) = no key."""
    key = explicit if explicit is not None else os.environ.get(API_KEY_ENV)
    return key or None


@dataclass(frozen=True, kw_only=True)
class GatewayOptions:
    """What `tritonforge openai` takes (its flags are generated from these fields)."""

    url: str = setting(help=f"Triton's gRPC address, e.g. localhost:{GRPC_PORT}", parse=host_port)
    host: str = setting(LOOPBACK, "address to listen on")
    port: int = setting(OPENAI_PORT, "port to listen on", parse=port_number)
    model: str = setting(DEFAULT_MODEL, "what it calls", choices=(BLS_MODEL, ENSEMBLE_MODEL))
    served_model_name: str = setting(SERVED_MODEL_NAME, "the model name /v1/models shows, and the only one "
                                                        "requests may name")
    api_key: str | None = setting(None, API_KEY_HELP, parse=str)
    workers: int = setting(1, "gateway processes sharing the port: one handles a few thousand streamed chunks a "
                              "second", parse=positive_int)
    stream_interval: int = setting(DEFAULT_STREAM_INTERVAL, "streamed chunks from the BLS of up to this many "
                                   "engine responses after the first (fewer, larger chunks: less gateway CPU a "
                                   "token, chunks that many tokens apart); 1 streams each", parse=positive_int)
    tool_parser: str = setting(DEFAULT_TOOL_PARSER, TOOL_PARSER_HELP, choices=tuple(PARSERS))
    reasoning_parser: str | None = setting(None, REASONING_PARSER_HELP, parse=str, choices=REASONING_PARSERS)
    lora_modules: tuple[str, ...] = setting((), "a LoRA adapter the repository serves, as NAME=TASK_ID (repeat for "
                                            "more): requests naming `model` NAME run with that lora_task_id, and "
                                            "/v1/models lists it (`tritonforge serve` passes a build's own; "
                                            "default: none)",
                                            repeat=True, metavar="NAME=TASK_ID")

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        adapters = lora_modules(self.lora_modules)
        if self.served_model_name in adapters:
            raise ValueError(f"--lora-modules names {self.served_model_name!r}, the served model's own name")


def lora_modules(specs: tuple[str, ...]) -> dict[str, int]:
    """NAME=TASK_ID each → {name: task id}, refused in one line where malformed or named twice."""
    adapters: dict[str, int] = {}
    for spec in specs:
        name, sep, task = spec.partition("=")
        if not sep or not name.strip() or not task.strip().isdigit():
            raise ValueError(f"--lora-modules {spec!r}: expected NAME=TASK_ID (a name, then the adapter's "
                             f"lora_task_id)")
        if name.strip() in adapters:
            raise ValueError(f"--lora-modules names {name.strip()!r} twice")
        adapters[name.strip()] = int(task)
    return adapters


def run(options: GatewayOptions, *, on_ready=lambda line: None, on_stop=lambda line: None) -> None:
    """Serve the gateway until interrupted. One process handles a few thousand streamed chunks a second;
    `options.workers` processes share the port, each connection going to the one with the fewest open
    connections (`tritonforge.gateway.workers`), and share their metrics; `on_ready(line)` once they
    all serve, `on_stop(line)` when a stop begins. The API key: `options.api_key`, else $TRITONFORGE_API_KEY."""
    import uvicorn

    make_app = functools.partial(create_app, options.url, model=options.model,
                                 served_model_name=options.served_model_name,
                                 api_key=api_key_from_environment(options.api_key),
                                 stream_interval=options.stream_interval, tool_parser=options.tool_parser,
                                 reasoning_parser=options.reasoning_parser,
                                 adapters=lora_modules(options.lora_modules))
    if options.workers == 1:
        config = uvicorn.Config(make_app(), host=options.host, port=options.port, log_level="warning",
                                timeout_graceful_shutdown=STOP_GRACE_S)
        _saying_stop(config, on_stop).run()
        return
    from .workers import serve_workers

    with tempfile.TemporaryDirectory(prefix="tritonforge-gateway-metrics-") as metrics_dir:
        os.environ[MULTIPROCESS_DIR_ENV] = metrics_dir  # read by the workers' metrics (spawned after this)
        serve_workers(make_app, host=options.host, port=options.port, workers=options.workers,
                      on_worker_exit=forget_worker, on_ready=on_ready, on_stop=on_stop)


def _saying_stop(config, on_stop):
    """uvicorn's server, saying `stop_line()` through `on_stop` at the first Ctrl-C or SIGTERM: its own lines of
    what it waits for are INFO, below the gateway's log level."""
    import uvicorn

    class SayingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                on_stop(stop_line())
            super().handle_exit(sig, frame)

    return SayingServer(config)


class GatewayThread:
    """The gateway served by uvicorn in a background thread (beside `tritonforge serve`, and in tests)."""

    def __init__(self, url: str, *, host: str = "127.0.0.1", port: int = OPENAI_PORT, model: str = DEFAULT_MODEL,
                 served_model_name: str = SERVED_MODEL_NAME, api_key: str | None = None,
                 tool_parser: str = DEFAULT_TOOL_PARSER, reasoning_parser: str | None = None,
                 adapters: dict[str, int] | None = None):
        import threading

        import uvicorn

        app = create_app(url, model=model, served_model_name=served_model_name, api_key=api_key,
                         tool_parser=tool_parser, reasoning_parser=reasoning_parser, adapters=adapters)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.base_url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.run, name="openai-gateway", daemon=True)

    def start(self, timeout_s: float = 30) -> GatewayThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise GatewayFailed(f"the OpenAI gateway did not start on {self.base_url} (its error is above)")
            time.sleep(0.05)
        return self

    def stop_accepting(self) -> None:
        """Take no new connection; the responses under way go on (a stop's first step)."""
        self.server.should_exit = True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop, letting the responses under way end for up to `timeout_s`, then cutting them."""
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout=FORCED_EXIT_S)
