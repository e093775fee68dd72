"""Start and stop a real `tritonserver` on a model repository (`tritonforge serve`, tests, benchmarks).

Finds the server in this order: an explicit path (argument or `TRITONSERVER`), `tritonserver` on PATH
(NVIDIA's containers; backends at `<bin>/../backends`), the nvidia-pytriton wheel's bundle (whose Python
backend stub for the running interpreter is copied into a private backends folder). The running
interpreter's `bin/` goes first on PATH, because the stub embeds the first `python3` it finds there.

Model control and repository APIs are not exposed to clients: the load API can upload code.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .engine_stream import ENGINE_GRPC_URL_ENV
from .triton_adapter import HEARTBEAT_DIR_ENV

logger = logging.getLogger(__name__)

# APIs a client of an LLM server never needs; restricted behind a header that only an operator knows.
RESTRICTED_APIS = "model-repository,model-config,shared-memory,statistics,trace,logging"
HTTP_MAX_INPUT_BYTES = 8 * 1024 * 1024  # a prompt of max_input_len tokens is far smaller
# Where the Python backend keeps each stub's shared-memory region. A stub that is killed (a crash, the
# supervisor's restart, a stop that had to SIGKILL) leaves its region there, a file of RAM: each server names
# its regions with a prefix of its own, and removes what is left under that prefix once it has exited.
SHARED_MEMORY_DIR = Path("/dev/shm")


class ServerError(RuntimeError):
    """The server did not start or died; the message quotes its log."""


@dataclass(frozen=True)
class ServerBinary:
    executable: Path
    backend_directory: Path
    library_path: Path | None = None  # extra LD_LIBRARY_PATH entry (the wheel's bundled libraries)


def _pytriton_bundle(work_dir: Path) -> ServerBinary | None:
    try:
        import pytriton
    except ImportError:
        return None
    root = Path(pytriton.__file__).resolve().parent
    bundle = root / "tritonserver"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = bundle / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton has no Python backend stub for Python {version}")
    backends = work_dir / "backends"
    shutil.copytree(bundle / "backends", backends, dirs_exist_ok=True)
    shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
    return ServerBinary(bundle / "bin" / "tritonserver", backends, root.parent / "nvidia_pytriton.libs")


def locate_server(work_dir: Path, explicit: str | os.PathLike | None = None) -> ServerBinary:
    explicit = explicit or os.environ.get("TRITONSERVER")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ServerError(f"tritonserver not found at {path}")
        return ServerBinary(path, path.resolve().parent.parent / "backends")
    on_path = shutil.which("tritonserver")
    if on_path:
        path = Path(on_path).resolve()
        return ServerBinary(path, path.parent.parent / "backends")
    bundled = _pytriton_bundle(work_dir)
    if bundled:
        return bundled
    raise ServerError("no tritonserver found: set TRITONSERVER, put it on PATH (NVIDIA's container), or "
                      "pip install 'tritonforge[server]' for the nvidia-pytriton bundle")


@functools.lru_cache(maxsize=8)
def _help_text(executable: Path, library_path: Path | None) -> str:
    env = dict(os.environ)
    if library_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(library_path), env.get("LD_LIBRARY_PATH")]))
    try:
        result = subprocess.run([str(executable), "--help"], capture_output=True, text=True, timeout=30, env=env,
                                check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout + result.stderr


def _supports_option(binary: ServerBinary, option: str) -> bool:
    return f"{option} " in _help_text(binary.executable, binary.library_path)


def redacted(command: list[str]) -> str:
    """A command line fit for a log: the restricted APIs' key hidden."""
    return " ".join(re.sub(r"admin-key=\S+", "admin-key=<hidden>", part) for part in command)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class TritonServer:
    """A tritonserver subprocess. Use as a context manager, or call start() / stop()."""

    repository: Path
    executable: str | None = None
    http_port: int = 0  # 0 = pick a free port
    grpc_port: int = 0
    metrics_port: int = 0
    address: str = "127.0.0.1"
    ready_timeout_s: float = 300.0
    exit_timeout_s: int = 10
    log_verbose: int = 0
    restricted_api_key: str | None = None  # header value that unlocks the restricted APIs; None = random
    # Which APIs need that key; "" opens them all (perf_analyzer reads the model config and statistics).
    restricted_apis: str = RESTRICTED_APIS
    require_all_models: bool = True  # False: serve the models that load, and be "ready" without the others
    world_size: int = 1  # TensorRT-LLM engines with tp*pp > 1: one tritonserver per MPI rank
    extra_args: list[str] = field(default_factory=list)
    log_file: Path | None = None  # kept after stop; None: a log in the work folder, removed with it
    # The largest HTTP request body accepted, where the server has the option (--http-max-input-size, Triton
    # 2.53+); 2.51 has none, and a 10 MB body to its `generate` endpoint can crash it (README, Limits).
    http_max_input_bytes: int = HTTP_MAX_INPUT_BYTES

    def __post_init__(self):
        self.repository = Path(self.repository).resolve()
        self._process: subprocess.Popen | None = None
        self._work_dir: Path | None = None  # ours: the log (unless log_file) and an unpacked server; removed at stop
        self._final_log = ""
        self.log_path: Path | None = None
        self.shm_prefix = f"tritonforge_{uuid.uuid4().hex[:12]}_"  # renewed at each start
        self.heartbeat_dir: Path | None = None  # where the stubs write their heartbeats (triton_adapter)

    @property
    def http_url(self) -> str:
        return f"{self.address}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.address}:{self.grpc_port}"

    @property
    def loopback_grpc_url(self) -> str:
        """The gRPC endpoint as a process on this host reaches it (the BLS, to call the engine)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.address, self.address)
        return f"[{host}]:{self.grpc_port}" if ":" in host else f"{host}:{self.grpc_port}"

    def command(self, binary: ServerBinary, rank: int = 0) -> list[str]:
        key = self.restricted_api_key or os.urandom(16).hex()
        restricted = []
        if self.restricted_apis:
            restricted = [f"--http-restricted-api={self.restricted_apis}:admin-key={key}",
                          f"--grpc-restricted-protocol={self.restricted_apis}:admin-key={key}"]
        return [
            str(binary.executable),
            f"--model-repository={self.repository}",
            f"--backend-directory={binary.backend_directory}",
            f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--http-address={self.address}", f"--grpc-address={self.address}",
            f"--metrics-address={self.address}",
            *restricted,
            *self._http_limit(binary),
            f"--exit-on-error={str(self.require_all_models).lower()}",
            f"--strict-readiness={str(self.require_all_models).lower()}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--log-verbose={self.log_verbose}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}{rank}_",
            *self.extra_args,
        ]

    def _http_limit(self, binary: ServerBinary) -> list[str]:
        if _supports_option(binary, "--http-max-input-size"):
            return [f"--http-max-input-size={self.http_max_input_bytes}"]
        logger.warning("this tritonserver has no --http-max-input-size: HTTP request bodies are not capped "
                       "(prompts are still checked by size before tokenizing)")
        return []

    def mpi_command(self, binary: ServerBinary) -> list[str]:
        """One tritonserver per MPI rank: rank 0 loads everything and serves the ports; the other ranks load
        only the engine model (whose executor never returns to them), each with its own shared-memory prefix."""
        if self.world_size == 1:
            return self.command(binary)
        command = ["mpirun", "--allow-run-as-root"]
        for rank in range(self.world_size):
            rank_args = ["--disable-auto-complete-config"]
            if rank > 0:
                rank_args += ["--model-control-mode=explicit", "--load-model=tensorrt_llm"]
            command += [*([":"] if rank else []), "-n", "1", *self.command(binary, rank), *rank_args]
        return command

    def environment(self, binary: ServerBinary) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if self.heartbeat_dir is not None:
            env[HEARTBEAT_DIR_ENV] = str(self.heartbeat_dir)
        env[ENGINE_GRPC_URL_ENV] = self.loopback_grpc_url
        # The stub links libpython by soname: make it find this interpreter's, not another build's
        # (a mismatch fails at import time with undefined symbols).
        libdir = sysconfig.get_config_var("LIBDIR") if sysconfig.get_config_var("Py_ENABLE_SHARED") else None
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [
            libdir, str(binary.library_path) if binary.library_path else None, env.get("LD_LIBRARY_PATH")]))
        return env

    def start(self) -> TritonServer:
        self.shm_prefix = f"tritonforge_{uuid.uuid4().hex[:12]}_"
        self._work_dir = Path(tempfile.mkdtemp(prefix="tritonforge-server-"))
        self.heartbeat_dir = self._work_dir / "heartbeats"
        self.heartbeat_dir.mkdir()
        binary = locate_server(self._work_dir, self.executable)
        self.http_port = self.http_port or free_port()
        self.grpc_port = self.grpc_port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        self.log_path = Path(self.log_file) if self.log_file else self._work_dir / "tritonserver.log"
        command = self.mpi_command(binary)
        logger.info("starting %s", redacted(command))
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             env=self.environment(binary), start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerError(f"tritonserver exited with code {self._process.returncode}:\n"
                                  f"{self.failure_summary()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        raise ServerError(f"tritonserver not ready after {self.ready_timeout_s:.0f} s:\n{self.failure_summary()}")

    def log_text(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return self._final_log  # the log of a stopped server whose work folder is gone

    def failure_summary(self, max_lines: int = 20, max_chars: int = 600) -> str:
        """The log lines that say why (model load failures first, else errors, else the tail), shortened."""
        lines = self.log_text().splitlines()
        failing = [line for line in lines if re.search(r"failed to load|UNAVAILABLE", line)]
        errors = [line for line in lines if re.search(r"\bE\d{4}|error|Error|Traceback", line)]
        chosen = (failing or errors or lines)[-max_lines:]
        return "\n".join(line if len(line) <= max_chars else line[:max_chars] + " ..." for line in chosen)

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop(self) -> int | None:
        """SIGTERM, wait for the server's own exit timeout, then SIGKILL what is left of its process group:
        a Python stub busy in a generation can outlive a server that exited cleanly."""
        if self._process is None:
            self._remove_work_dir()
            self._remove_shared_memory()
            return None
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=self.exit_timeout_s + 5)
            except subprocess.TimeoutExpired:
                logger.warning("tritonserver did not exit in time; killing it")
        try:
            os.killpg(self._process.pid, signal.SIGKILL)  # the group is ours (start_new_session)
        except ProcessLookupError:
            pass
        self._process.wait()
        self._wait_group_gone()
        self._remove_work_dir()
        self._remove_shared_memory()
        return self._process.returncode

    def kill(self) -> None:
        """SIGKILL the server and its stubs now: open streams end with a connection error at once."""
        if self._process is not None and self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._process.wait()
        self.stop()

    def _remove_work_dir(self) -> None:
        if self._work_dir is None:
            return
        self._final_log = self.log_text()
        shutil.rmtree(self._work_dir, ignore_errors=True)
        if self.log_path is not None and self._work_dir in self.log_path.parents:
            self.log_path = None
        self._work_dir = None

    def _wait_group_gone(self, timeout_s: float = 5.0) -> None:
        """Until no process of the server's group is left: stubs killed with their server die a moment later,
        and until then they hold its ports and their shared memory."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self._process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)
        logger.warning("processes of tritonserver's group (%d) still exist %.0f s after SIGKILL",
                       self._process.pid, timeout_s)

    def _remove_shared_memory(self) -> None:
        """The regions of this server's stubs that outlived them (only after the whole group is gone)."""
        for region in SHARED_MEMORY_DIR.glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
