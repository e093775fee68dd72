"""Start and stop a real `tritonserver` on a model repository (`tritonforge serve`, tests, benchmarks).

The server to run is found by `binary.locate_server`. The running interpreter's `bin/` goes first on PATH,
because the stub embeds the first `python3` it finds there.

Model control and repository APIs are not exposed to clients: the load API can upload code.

A stop ends within the exit timeout (`exit_timeout_s`): open requests get all of it but a reserve to finish, the
engine ends the rest, and only then is the server signalled, so that it unloads its models and exits by itself.

Nothing is left behind, even by a run killed from outside: the server dies with the process that started
it (PR_SET_PDEATHSIG), its stubs end once it is gone (runtime/stub_watch.py), their temporary files go into
its work folder, which records the pids it belongs to, their shared-memory regions carry the starting process's
pid in their names, and the record names the Python backend's folder in /tmp (`python_env`); every start removes
what such dead runs left (`leftovers.sweep_leftovers`), and says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import re
import shutil
import signal
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

from ..facts.environment import (
    DRAINED_SUFFIX,
    DRAINS_SUFFIX,
    ENGINE_GRPC_URL_ENV,
    HEARTBEAT_DIR_ENV,
    HEARTBEAT_PERIOD_S,
    MODEL_DRAIN_END_S,
    SERVER_PID_FILE,
    STOPPING_FILE,
    stopping_text,
)
from . import python_env
from .binary import ServerBinary, locate_server, note_no_http_limit, supports_option
from .errors import ServerError
from .leftovers import OWNER_RECORD, SHARED_MEMORY_DIR, WORK_DIR_PREFIX, sweep_leftovers
from .ports import PortInUse, check_ports_free, free_ports
from .repository import check_repository
from .start_lock import machine_start_lock

logger = logging.getLogger(__name__)

# APIs a client of an LLM server never needs; restricted behind a header that only an operator knows.
RESTRICTED_APIS = "model-repository,model-config,shared-memory,statistics,trace,logging"
HTTP_MAX_INPUT_BYTES = 8 * 1024 * 1024  # a prompt of max_input_len tokens is far smaller
USAGE_TEXT_INDENTS = ("  --", "\t")  # the lines of tritonserver's --help text
# A stop ends within the exit timeout. Open requests get all of it but a reserve kept for the models to end those
# still open (about a second: a last response that is an error waits `ERROR_AFTER_RESPONSE_S`), the server to
# unload its models and exit: 3 to 5 s on the 2-core CPU machine under ten streams. The reserve is half the
# timeout, at most STOP_RESERVE_S and at least STOP_RESERVE_MIN_S while that leaves open requests a fifth of it:
# a short timeout (6 s: 3 s of reserve) ended in a kill. Kubernetes sets the timeout from the pod's grace period
# (deploy/helm/tritonforge).
DEFAULT_EXIT_TIMEOUT_S = 20.0
STOP_RESERVE_S = 10.0
STOP_RESERVE_MIN_S = 5.0
# After the time open requests get at a stop, how long the engine may take to end the rest (its
# EngineService.drain waits MODEL_DRAIN_END_S) and to say so (a heartbeat later).
DRAIN_END_S = MODEL_DRAIN_END_S + 2 * HEARTBEAT_PERIOD_S
_PR_SET_PDEATHSIG = 1
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where `tritonforge` imports from, for the reaper
REAPER_EXIT_S = 5.0  # how long a stop waits for the reaper, which has nothing to do then, to end
# The Python backend of Triton < 2.61 (25.09; python_backend PR #408) can wedge a load for good: a stub that
# misses its 1 s health check while its model initializes (a starved CPU is enough) is waited for with a plain
# waitpid, and that stub, still alive, waits for its parent. A server thread in waitpid this long while
# models load, with no stub having logged its own failure (STUB_FAILED, after which it exits and is reaped),
# is that wedge: the start kills the server and tries once more.
STUB_WEDGE_S = 3.0
STUB_FAILED = "Failed to initialize Python stub"
# tritonserver's log: a model's load failure (its name, its error), a line that reports an error, and the
# prefix of its own lines (severity, date, time, thread, source).
_LOAD_FAILURE = re.compile(r"failed to load '([^']+)' version \d+: (.*?)\"?$")
_ERROR_LINE = re.compile(r"\bE\d{4}|error|Error|Traceback|terminate called|what\(\)|Signal \(\d+\)|"
                         r"Invalid option|unrecognized option|Unexpected argument")
_LOG_PREFIX = re.compile(r"^[EWI]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ")


class StubLaunchWedged(ServerError):
    """The Python backend waits forever on a stub that failed its health check while loading (STUB_WEDGE_S)."""


class CrashedWhileLoading(ServerError):
    """tritonserver died of a signal (an abort, a segfault) before it was ready: a failure of the server, not
    of the repository, whose failures it answers with an exit code of its own."""


# What a start makes once more: failures of the server itself, on the way to serving a repository that loads.
RETRIED_AT_START = (StubLaunchWedged, CrashedWhileLoading)
# Starts in all before such a failure is the caller's: a machine loaded with several servers starting at once has
# wedged two starts in a row, never three.
START_ATTEMPTS = 3


def threads_waiting_for_a_child(pid: int) -> bool:
    """Whether a thread of process `pid` sits in waitpid (Linux: its wchan reads do_wait); False where unknown."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            if (task / "wchan").read_text().strip() == "do_wait":
                return True
        except OSError:
            continue
    return False


def _die_with_parent() -> None:
    """In the server's process, before exec: the kernel kills it when the process that started it dies, so a
    launcher killed with SIGKILL leaves no orphan server holding its ports."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def redacted(command: list[str]) -> str:
    """A command line fit for a log: the restricted APIs' key hidden."""
    return " ".join(re.sub(r"admin-key=\S+", "admin-key=<hidden>", part) for part in command)


def _new_shm_prefix() -> str:
    return f"tritonforge_pid{os.getpid()}_{uuid.uuid4().hex[:12]}_"


def only_models(*models: str) -> list[str]:
    """tritonserver arguments that load these models of the repository and no other (`extra_args`): a check of
    the engine alone (the accuracy gate) need not wait for every Python stub of the repository to start."""
    return ["--model-control-mode=explicit", *(f"--load-model={model}" for model in models)]


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
    exit_timeout_s: float = DEFAULT_EXIT_TIMEOUT_S  # a stop ends within this; only a server still running is killed
    drain_timeout_s: float | None = None  # how long open requests get to finish at a stop; None: all but the reserve
    log_verbose: int = 0
    restricted_api_key: str | None = None  # header value that unlocks the restricted APIs; None = random
    # Which APIs need that key; "" opens them all (perf_analyzer reads the model config and statistics).
    restricted_apis: str = RESTRICTED_APIS
    require_all_models: bool = True  # False: serve the models that load, and be "ready" without the others
    world_size: int = 1  # TensorRT-LLM engines with tp*pp > 1: one tritonserver per MPI rank
    extra_args: list[str] = field(default_factory=list)
    log_file: Path | None = None  # kept after stop; None: a log in the work folder, removed with it
    # The largest HTTP request body accepted, where the server has the option (--http-max-input-size, Triton
    # 2.53+); 2.51 has none, and a 10 MB body to its `generate` endpoint can crash it
    # (docs/design/faults.md#limits-before-work).
    http_max_input_bytes: int = HTTP_MAX_INPUT_BYTES

    def __post_init__(self):
        self.repository = Path(self.repository).resolve()
        self._process: subprocess.Popen | None = None
        self._work_dir: Path | None = None  # ours: the log (unless log_file) and an unpacked server; removed at stop
        self._final_log = ""
        self.log_path: Path | None = None
        self.shm_prefix = _new_shm_prefix()  # renewed at each start
        self.heartbeat_dir: Path | None = None  # where the stubs write their heartbeats (triton_adapter)
        self.python_env: Path | None = None  # the Python backend's folder in /tmp, where known (python_env.py)
        self._python_env_claim: python_env.PythonEnvClaim | None = None
        self._reaper: subprocess.Popen | None = None  # cleans up after a kill of this process (_start_reaper)
        self._reaper_pipe: int | None = None

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
            f"--exit-timeout-secs={max(math.ceil(self.stop_reserve_s), 1)}",
            f"--log-verbose={self.log_verbose}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}{rank}_",
            *self.extra_args,
        ]

    def _http_limit(self, binary: ServerBinary) -> list[str]:
        if supports_option(binary, "--http-max-input-size"):
            return [f"--http-max-input-size={self.http_max_input_bytes}"]
        note_no_http_limit(binary.executable)
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
        if self._work_dir is not None:  # the stubs' temporary files (the replay engine's lock) go with it
            env["TMPDIR"] = str(self._work_dir / "tmp")
        env[ENGINE_GRPC_URL_ENV] = self.loopback_grpc_url
        # The stub links libpython by soname: make it find this interpreter's, not another build's
        # (a mismatch fails at import time with undefined symbols).
        libdir = sysconfig.get_config_var("LIBDIR") if sysconfig.get_config_var("Py_ENABLE_SHARED") else None
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [
            libdir, str(binary.library_path) if binary.library_path else None, env.get("LD_LIBRARY_PATH")]))
        return env

    def start(self) -> TritonServer:
        """Start and wait until ready. Refuses a path that holds no model and ports already taken, before
        anything runs; removes what killed runs of ours left first. A load wedged by the Python backend
        (STUB_WEDGE_S) is killed and started again (START_ATTEMPTS in all), and so is a server that crashed while
        loading (Triton 2.51 has aborted at a start on a loaded machine: an uncaught lock_exception, an epoll_wait
        on a closed descriptor); on new ports where they were picked here. Where SERVER_START_LOCK_ENV names a
        lock file, each attempt waits for the other starts that name it to end (machine_start_lock)."""
        picked = {name: getattr(self, name) == 0 for name in ("http_port", "grpc_port", "metrics_port")}
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                with machine_start_lock():
                    return self._start()
            except RETRIED_AT_START as failure:
                if attempt == START_ATTEMPTS:
                    raise
                logger.warning("%s\nstarting the server once more", failure)
                for name, was_picked in picked.items():
                    if was_picked:
                        setattr(self, name, 0)
        raise AssertionError("unreachable")

    def _start(self) -> TritonServer:
        check_repository(self.repository)
        check_ports_free(self.address, {"HTTP port": self.http_port, "gRPC port": self.grpc_port,
                                        "metrics port": self.metrics_port})
        sweep_leftovers()
        self.shm_prefix = _new_shm_prefix()
        self._work_dir = Path(tempfile.mkdtemp(prefix=WORK_DIR_PREFIX))
        self._process, self.python_env = None, None
        self._record_owner()
        self.heartbeat_dir = self._work_dir / "heartbeats"
        self.heartbeat_dir.mkdir()
        (self._work_dir / "tmp").mkdir()
        try:
            binary = locate_server(self._work_dir, self.executable)
        except BaseException:
            self._remove_work_dir()
            raise
        picked = iter(free_ports(3))
        self.http_port = self.http_port or next(picked)
        self.grpc_port = self.grpc_port or next(picked)
        self.metrics_port = self.metrics_port or next(picked)
        self.log_path = Path(self.log_file) if self.log_file else self._work_dir / "tritonserver.log"
        command = self.mpi_command(binary)
        logger.info("starting %s", redacted(command))
        # Under mpirun the ranks are no children of the launched process: their folders are not told apart.
        self._python_env_claim = python_env.PythonEnvClaim().begin() if self.world_size == 1 else None
        try:
            with open(self.log_path, "wb") as log:
                self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                 env=self.environment(binary), start_new_session=True,
                                                 preexec_fn=_die_with_parent)
        except BaseException:
            self._settle_python_env()
            self._remove_work_dir()
            raise
        self._record_owner()
        self._start_reaper()
        if self.world_size == 1:  # under mpirun each rank's stubs have their own tritonserver for parent
            _write_whole(self.heartbeat_dir / SERVER_PID_FILE, str(self._process.pid))
        try:
            self._wait_ready()
        except BaseException as failure:
            self._settle_python_env()
            if isinstance(failure, StubLaunchWedged):
                self.kill()  # a wedged load never lets the server exit by itself
            else:
                self.stop()
            raise
        self._settle_python_env()
        return self

    def _start_reaper(self) -> None:
        """The process that cleans up after this launcher if it is killed with the server running (serve/reaper.py):
        in a session of its own (a Ctrl-C to the terminal's group does not reach it), it waits on a pipe that only
        this process holds open, and ends once `stop` closes it."""
        self._end_reaper()  # a restarted server's: its run was stopped
        read, write = os.pipe()
        try:
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "tritonforge.serve.reaper", str(self._work_dir), str(self._process.pid)],
                stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT),
                                                                               os.environ.get("PYTHONPATH")]))})
        except OSError as error:
            os.close(write)
            logger.warning("no process to clean up after a kill of this one (%s): the next start will", error)
            return
        finally:
            os.close(read)
        self._reaper_pipe = write

    def _end_reaper(self) -> None:
        """Let the reaper go (it finds the run stopped, or cleans up what is left of it) and wait for it."""
        if self._reaper_pipe is not None:
            os.close(self._reaper_pipe)
            self._reaper_pipe = None
        if self._reaper is not None:
            try:
                self._reaper.wait(timeout=REAPER_EXIT_S)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None

    def _settle_python_env(self) -> None:
        """Which python_env folder is the server's, now that it is ready (or failed); recorded for a sweep."""
        if self._python_env_claim is not None:
            self.python_env = self._python_env_claim.finish(self.pid)
            self._python_env_claim = None
            if self.python_env is not None and self._work_dir is not None:
                self._record_owner()

    def _record_owner(self) -> None:
        """Which processes the work folder belongs to (once all are gone, a later start may remove it) and what
        else of the run's a sweep removes: its stubs' shared memory and its Python backend folder."""
        pids = [os.getpid(), *([self._process.pid] if self._process is not None else [])]
        record = {"pids": pids, "repository": str(self.repository), "shm_prefix": self.shm_prefix,
                  "python_env": str(self.python_env) if self.python_env else None}
        _write_whole(self._work_dir / OWNER_RECORD, json.dumps(record))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        waiting_for_a_stub_since = None
        while time.monotonic() < deadline:
            if self._python_env_claim is not None:
                self._python_env_claim.poll(self._process.pid)
            # Under mpirun the launched process is not a tritonserver: no wedge to see there.
            if (self.world_size == 1 and threads_waiting_for_a_child(self._process.pid)
                    and STUB_FAILED not in self.log_text()):
                waiting_for_a_stub_since = waiting_for_a_stub_since or time.monotonic()
                if time.monotonic() - waiting_for_a_stub_since >= STUB_WEDGE_S:
                    loading = ", ".join(self.models_loading()) or "a Python model"
                    raise StubLaunchWedged(
                        f"the load of {loading} is wedged: its stub missed the Python backend's health check "
                        f"and Triton < 2.61 waits for it forever")
            else:
                waiting_for_a_stub_since = None
            if self._process.poll() is not None:
                log = self.log_text()
                if re.search(r"already in use|Address in use", log):
                    raise PortInUse(f"tritonserver could not listen on its ports (HTTP {self.http_port}, gRPC "
                                    f"{self.grpc_port}, metrics {self.metrics_port}): one is already in use")
                code = self._process.returncode
                # The first line says why (the CLI shows it alone); the log lines around it follow.
                if code < 0:
                    crash = signal.strsignal(-code) or f"signal {-code}"
                    raise CrashedWhileLoading(f"tritonserver crashed while loading ({crash}): "
                                              f"{self.failure_reason()}\n{self.failure_summary()}")
                raise ServerError(f"tritonserver exited with code {code}: {self.failure_reason()}\n"
                                  f"{self.failure_summary()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        loading = self.models_loading()
        still = f" ({', '.join(loading)} still loading)" if loading else ""
        raise ServerError(f"tritonserver not ready after {self.ready_timeout_s:.0f} s{still}:\n"
                          f"{self.failure_summary()}")

    def log_text(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return self._final_log  # the log of a stopped server whose work folder is gone

    def failure_reason(self, max_chars: int = 400) -> str:
        """The one log line that says why the server stopped, without Triton's prefix: the first model that
        failed to load and its error (Triton's later lines repeat it, or blame the models that needed it), else
        the last error line, else the last line (tritonserver refusing its command line prints only that)."""
        lines = [line for line in self.log_text().splitlines() if not line.startswith(USAGE_TEXT_INDENTS)]
        for line in lines:
            failed = _LOAD_FAILURE.search(line)
            if failed:
                # Triton quotes the message, a Python model's traceback in it as escaped newlines.
                message = failed.group(2).split("\\n")[0]
                reason = f"{failed.group(1)} failed to load: {message}"
                break
        else:
            errors = [line for line in lines if _ERROR_LINE.search(line)]
            chosen = errors or [line for line in lines if line.strip()]
            reason = _LOG_PREFIX.sub("", chosen[-1]).strip().strip('"') if chosen else "its log is empty"
        return reason if len(reason) <= max_chars else reason[:max_chars] + " ..."

    def failure_summary(self, max_lines: int = 20, max_chars: int = 600) -> str:
        """The log lines that say why (model load failures first, else errors, else the tail), shortened."""
        # tritonserver's usage text (printed when it refuses an option) would bury that option's line.
        lines = [line for line in self.log_text().splitlines() if not line.startswith(USAGE_TEXT_INDENTS)]
        failing = [line for line in lines if re.search(r"failed to load|UNAVAILABLE", line)]
        # A crash: C++'s uncaught-exception line with its what(), and Triton's "Signal (6) received."
        errors = [line for line in lines if _ERROR_LINE.search(line)]
        chosen = (failing or errors or lines)[-max_lines:]
        return "\n".join(line if len(line) <= max_chars else line[:max_chars] + " ..." for line in chosen)

    def models_loading(self) -> list[str]:
        """The models whose load the log shows begun and not finished: what a server that is not ready waits on
        (a Python model's initialize that never returns, say)."""
        log = self.log_text()
        begun = re.findall(r'"loading: ([^:"]+):\d+"', log)
        done = set(re.findall(r"(?:successfully loaded|failed to load) '([^']+)'", log))
        return sorted(set(begun) - done)

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def stop_reserve_s(self) -> float:
        """The end of the exit timeout that open requests do not get: for the engine to end those still open,
        and for the server to unload its models and exit."""
        return min(STOP_RESERVE_S, max(self.exit_timeout_s / 2, min(STOP_RESERVE_MIN_S, self.exit_timeout_s * 4 / 5)))

    @property
    def drain_s(self) -> float:
        """How long open requests get to finish at a stop."""
        return self.exit_timeout_s - self.stop_reserve_s if self.drain_timeout_s is None else self.drain_timeout_s

    def stop(self) -> int | None:
        """End within the exit timeout: open requests get `drain_s` to finish while the server still serves, the
        engine ends the rest, then SIGTERM, and the server unloads its models and exits by itself. Only a server
        still running at the end of the exit timeout is killed, and what is left of its process group in any
        case: a Python stub busy in a generation can outlive a server that exited."""
        if self._process is None:
            self._remove_work_dir()
            self._remove_shared_memory()
            return None
        if self._process.poll() is None:
            deadline = time.monotonic() + self.exit_timeout_s
            self._drain(min(time.monotonic() + self.drain_s, deadline), deadline)
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                logger.warning("tritonserver did not exit within its exit timeout (%g s); killing it",
                               self.exit_timeout_s)
        try:
            os.killpg(self._process.pid, signal.SIGKILL)  # the group is ours (start_new_session)
        except ProcessLookupError:
            pass
        self._process.wait()
        self._wait_group_gone()
        self._remove_work_dir()
        self._remove_shared_memory()
        python_env.remove(self.python_env)  # a server that exited by itself removed it already
        self.python_env = None
        self._end_reaper()
        return self._process.returncode

    def _drain(self, drained_by: float, deadline: float) -> None:
        """Before the server is signalled: open requests get until `drained_by` (time.monotonic) to finish, then
        the engine ends the rest (environment.STOPPING_FILE: an ensemble request still open when Triton is
        signalled is never ended, and holds its exit). Returns once every model that drains has, at the latest
        a few seconds after that time, and never after `deadline`."""
        if self.heartbeat_dir is None or not self.heartbeat_dir.is_dir():
            return
        draining = [path.with_suffix(DRAINED_SUFFIX) for path in self.heartbeat_dir.glob(f"*{DRAINS_SUFFIX}")]
        if not draining:
            return
        _write_whole(self.heartbeat_dir / STOPPING_FILE, stopping_text(drained_by))
        give_up = min(drained_by + DRAIN_END_S, deadline)
        while not all(path.exists() for path in draining) and time.monotonic() < give_up:
            if self._process.poll() is not None:
                return
            time.sleep(0.05)  # the stubs' files are the only signal across these processes

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


def _write_whole(path: Path, text: str) -> None:
    """Readers never see the file half-written: it appears whole, with a rename."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.replace(partial, path)
