"""What `tritonforge serve` takes: each option's default, help and flag declared once, as a field; the command
line is generated from these fields (`tritonforge.facts.settings`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..facts.contract import BLS_MODEL, ENSEMBLE_MODEL
from ..facts.ports import GRPC_PORT, HTTP_PORT, LOOPBACK, METRICS_PORT, check_distinct_ports, port_number
from ..facts.settings import positive_seconds, setting
from ..gateway.options import API_KEY_HELP, REASONING_PARSER_HELP, TOOL_PARSER_HELP
from ..gateway.reasoning import REASONING_PARSERS
from ..gateway.serving import DEFAULT_MODEL as OPENAI_DEFAULT_MODEL
from ..gateway.serving import SERVED_MODEL_NAME
from ..gateway.tool_parsers import PARSERS
from .liveness import DEFAULT_WEDGED_AFTER_S
from .server import DEFAULT_EXIT_TIMEOUT_S, STOP_RESERVE_MIN_S, STOP_RESERVE_S


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    tritonserver: str | None = setting(None, "path of the tritonserver binary (default: $TRITONSERVER, then "
                                             "tritonserver on PATH, then the nvidia-pytriton wheel's)", parse=str)
    address: str = setting(LOOPBACK, "address the HTTP, gRPC and metrics endpoints listen on (0.0.0.0: every "
                                     "interface)")
    http_port: int = setting(HTTP_PORT, "HTTP/REST port (generate, generate_stream)", parse=port_number)
    grpc_port: int = setting(GRPC_PORT, "gRPC port (streaming)", parse=port_number)
    metrics_port: int = setting(METRICS_PORT, "Prometheus metrics port", parse=port_number)
    log_verbose: int = setting(0, "tritonserver's --log-verbose level (0: off)")
    wedged_after_s: float = setting(DEFAULT_WEDGED_AFTER_S, "restart the server when a Python model has answered "
                                                            "no liveness probe for this long (0: no probes)")
    openai_port: int | None = setting(None, "also serve OpenAI's API (/v1/completions, /v1/chat/completions, "
                                            "/v1/responses) on this port (default: none: no OpenAI API)",
                                      parse=port_number)
    openai_model: str = setting(OPENAI_DEFAULT_MODEL, "what the OpenAI API calls", choices=(BLS_MODEL, ENSEMBLE_MODEL))
    served_model_name: str = setting(SERVED_MODEL_NAME, "the model name the OpenAI API shows")
    api_key: str | None = setting(None, API_KEY_HELP, parse=str)
    tool_parser: str | None = setting(None, f"{TOOL_PARSER_HELP}; default: the one its chat template writes, else "
                                            f"hermes", parse=str, choices=tuple(PARSERS))
    reasoning_parser: str | None = setting(None, REASONING_PARSER_HELP, parse=str, choices=REASONING_PARSERS)
    exit_timeout_s: float = setting(DEFAULT_EXIT_TIMEOUT_S, f"a stop (Ctrl-C, SIGTERM) ends within this: open streams "
                                                            f"get all of it but the last {STOP_RESERVE_S:g} s (half of "
                                                            f"it, at least {STOP_RESERVE_MIN_S:g} s while open streams "
                                                            f"keep a fifth) to finish, the server then ends the rest "
                                                            f"and exits", parse=positive_seconds)
    log_file: Path | None = setting(None, "tritonserver's log, kept after exit (default: a temporary file removed "
                                          "at exit)", parse=Path)
    open_apis: bool = setting(False, "leave model-config, statistics, ... unrestricted (perf_analyzer reads them)")

    def __post_init__(self):
        check_distinct_ports(self.ports())

    def ports(self) -> dict[str, int | None]:
        """The ports it listens on, by their flags (the OpenAI API's only when asked for)."""
        return {"--http-port": self.http_port, "--grpc-port": self.grpc_port, "--metrics-port": self.metrics_port,
                "--openai-port": self.openai_port}
