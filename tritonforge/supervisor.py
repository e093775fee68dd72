"""Keep a tritonserver serving: notice a dead Python stub or a dead server, end what is in flight, restart.

Triton 2.51 never restarts a crashed Python stub: its model answers "Stub process is not healthy" for ever
while readiness still says 200, and the requests the stub held never end. The only reliable recovery is a
fresh server. So `tritonforge serve` runs the server under this supervisor:

- every `period_s` it checks that tritonserver runs and that every Python stub it started at load is alive
  (a killed stub stays a zombie until the server reaps it, and counts as dead);
- on a death it kills the server's whole process group at once (SIGKILL: a clean shutdown would wait for
  requests that can never finish), so every open stream ends with a connection error within a second and
  readiness stops answering;
- then it starts a fresh server on the same ports, waiting 1, 2, 4 ... up to `max_backoff_s` seconds between
  attempts that fail quickly in a row, and logs what happened each time.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from .profiling import all_stub_pids
from .server import ServerError, TritonServer

logger = logging.getLogger(__name__)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie or a dead process


class Supervisor:
    def __init__(self, server: TritonServer, *, period_s: float = 0.5, max_backoff_s: float = 60.0,
                 stable_s: float = 60.0):
        self.server = server
        self.period_s = period_s
        self.max_backoff_s = max_backoff_s
        self.stable_s = stable_s  # a server up this long resets the backoff
        self.stubs: dict[int, str] = {}
        self.restarts = 0

    def start(self) -> None:
        self.server.start()
        self.stubs = all_stub_pids(self.server.pid)
        logger.info("supervising tritonserver (pid %s) and %d Python stubs", self.server.pid, len(self.stubs))

    def problem(self) -> str | None:
        """Why the server must be restarted, or None."""
        if not self.server.is_running():
            return f"tritonserver exited:\n{self.server.failure_summary()}"
        dead = sorted({model for pid, model in self.stubs.items() if not _alive(pid)})
        if dead:
            return f"the Python stub of {', '.join(dead)} died"
        return None

    def run(self, stop: threading.Event) -> None:
        """Supervise until `stop` is set; the server is stopped on the way out."""
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
                self.server.kill()
                while not stop.is_set():
                    try:
                        self.start()
                        break
                    except ServerError as error:
                        logger.error("tritonserver did not come back (%s); next attempt in %.0f s", error, backoff)
                        stop.wait(backoff)
                        backoff = min(backoff * 2, self.max_backoff_s)
                self.restarts += 1
                started = time.monotonic()
                logger.warning("tritonserver is serving again (restart %d)", self.restarts)
        finally:
            self.server.stop()
