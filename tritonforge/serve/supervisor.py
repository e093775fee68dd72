"""Keep a tritonserver serving: notice a dead Python stub or a dead server, end what is in flight, restart.

Triton 2.51 never restarts a crashed Python stub: its model answers "Stub process is not healthy" for ever
while readiness still says 200, and the requests the stub held never end. The only reliable recovery is a
fresh server. So `tritonforge serve` runs the server under this supervisor:

- every `period_s` it checks that tritonserver runs and that every Python stub it started at load is alive
  (a killed stub stays a zombie until the server reaps it, and counts as dead);
- a stub that is alive but runs nothing is wedged, and counts as dead too (`wedged_after_s`; 0 turns these
  checks off): every stub writes a heartbeat each second from a thread of its own (triton_adapter), and one
  silent for `wedged_after_s` is wedged, whichever instance of its model it is; and liveness probes
  (tritonforge/serve/liveness.py) ask each Python model for a cheap answer every few seconds, so that a model
  none of whose instances answers is wedged even while its threads still beat;
- on a death it kills the server's whole process group at once (SIGKILL: a clean shutdown would wait for
  requests that can never finish), so every open stream ends with a connection error within a second and
  readiness stops answering;
- then it starts a fresh server on the same ports, waiting 1, 2, 4 ... up to `max_backoff_s` seconds between
  attempts that fail quickly in a row, and logs what happened each time;
- it gives up, raising `ServerError`, when a server cannot listen on its ports (`PortInUse`: starting again
  cannot help) or after `max_failed_starts` failed starts in a row.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from .errors import ServerError
from .liveness import DEFAULT_PERIOD_S, DEFAULT_WEDGED_AFTER_S, LivenessProbes, probed_models
from .ports import PortInUse
from .processes import all_stub_pids
from .server import TritonServer

logger = logging.getLogger(__name__)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie or a dead process


class Supervisor:
    def __init__(self, server: TritonServer, *, period_s: float = 0.5, max_backoff_s: float = 60.0,
                 stable_s: float = 60.0, wedged_after_s: float = DEFAULT_WEDGED_AFTER_S,
                 probe_period_s: float = DEFAULT_PERIOD_S, max_failed_starts: int = 5):
        self.server = server
        self.max_failed_starts = max_failed_starts
        self.period_s = period_s
        self.max_backoff_s = max_backoff_s
        self.stable_s = stable_s  # a server up this long resets the backoff
        if wedged_after_s < 0 or probe_period_s <= 0:
            raise ValueError(f"--wedged-after-s must be >= 0 (0: no liveness checks), got {wedged_after_s}; the "
                             f"probe period must be > 0, got {probe_period_s}")
        self.wedged_after_s = wedged_after_s
        self.probe_period_s = probe_period_s
        self.stubs: dict[int, str] = {}
        self.probes: LivenessProbes | None = None
        self.restarts = 0

    def start(self) -> None:
        self.server.start()
        self.stubs = all_stub_pids(self.server.pid)
        if self.wedged_after_s > 0:
            models = probed_models(self.server.repository, self.stubs.values())
            self.probes = LivenessProbes(self.server.grpc_url, models, period_s=self.probe_period_s,
                                         wedged_after_s=self.wedged_after_s).start()
        logger.info("supervising tritonserver (pid %s) and %d Python stubs", self.server.pid, len(self.stubs))

    def _stop_probes(self) -> None:
        if self.probes is not None:
            self.probes.stop()
            self.probes = None

    def problem(self) -> str | None:
        """Why the server must be restarted, or None."""
        if not self.server.is_running():
            return f"tritonserver exited:\n{self.server.failure_summary()}"
        dead = sorted({model for pid, model in self.stubs.items() if not _alive(pid)})
        if dead:
            return f"the Python stub of {', '.join(dead)} died"
        silent = sorted(set(self._silent_stubs()))
        if silent:
            return f"the Python stub of {', '.join(silent)} wrote no heartbeat for {self.wedged_after_s:.0f} s (wedged)"
        wedged = self.probes.wedged() if self.probes is not None else []
        if wedged:
            return f"{', '.join(wedged)} answered no liveness probe in {self.wedged_after_s:.0f} s (wedged)"
        return None

    def _silent_stubs(self) -> list[str]:
        """The models of stubs whose heartbeat is older than `wedged_after_s` (stubs that never wrote one, as
        models without the heartbeat, are not judged)."""
        if self.wedged_after_s <= 0 or self.server.heartbeat_dir is None:
            return []
        silent = []
        for pid, model in self.stubs.items():
            try:
                beat = float((self.server.heartbeat_dir / str(pid)).read_text())
            except (OSError, ValueError):
                continue
            if time.monotonic() - beat > self.wedged_after_s:
                silent.append(model)
        return silent

    def run(self, stop: threading.Event) -> None:
        """Supervise until `stop` is set; the server is stopped on the way out. Raises `ServerError` when the
        server cannot be brought back."""
        backoff = 1.0
        started = time.monotonic()
        try:
            while not stop.wait(self.period_s):
                problem = self.problem()
                if problem is None:
                    if time.monotonic() - started > self.stable_s:
                        backoff = 1.0
                    continue
                logger.error("%s; restarting tritonserver (restart %d)", problem, self.restarts + 1)
                self._stop_probes()
                self.server.kill()
                backoff = self._restart(stop, backoff)
                if stop.is_set():
                    break
                self.restarts += 1
                started = time.monotonic()
                logger.warning("tritonserver is serving again (restart %d)", self.restarts)
        finally:
            self._stop_probes()
            self.server.stop()

    def _restart(self, stop: threading.Event, backoff: float) -> float:
        """Start a fresh server (unless `stop` is set first); return the next backoff."""
        failures = 0
        while not stop.is_set():
            try:
                self.start()
                return backoff
            except PortInUse as error:
                raise ServerError(f"{error}; not restarting it (the port stays taken)") from None
            except ServerError as error:
                failures += 1
                if failures >= self.max_failed_starts:
                    raise ServerError(f"tritonserver did not come back in {failures} attempts in a row; giving up; "
                                      f"the last: {error}") from None
                logger.error("tritonserver did not come back (%s); next attempt in %.0f s", error, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
        return backoff
