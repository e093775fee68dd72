"""The supervisor's waits between failed starts: doubling up to `max_backoff_s`, carried over restarts while
the server keeps failing soon after each, and back to 1 s once it has served `stable_s`. The server, the
clock and the waits are scripted stand-ins, so nothing here sleeps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tritonforge.serve import supervisor as supervisor_module
from tritonforge.serve.errors import ServerError
from tritonforge.serve.ports import PortInUse
from tritonforge.serve.supervisor import Supervisor

PERIOD_S = 0.25


class ScriptedServer:
    """A stand-in for TritonServer: each start fails or succeeds as `starts` says, in turn."""

    def __init__(self, starts: list[bool]):
        self.starts = iter(starts)
        self.pid = None

    def start(self) -> None:
        if not next(self.starts):
            raise ServerError("tritonserver exited with code 1")

    def kill(self) -> None:
        pass

    def stop(self) -> None:
        pass


class ScriptedStop:
    """The supervisor's stop event: its period waits end the run after `checks` of them; every other wait is a
    backoff, recorded and returned at once."""

    def __init__(self, checks: int):
        self.checks = checks
        self.backoffs: list[float] = []

    def wait(self, timeout: float) -> bool:
        if timeout == PERIOD_S:
            self.checks -= 1
            return self.is_set()
        self.backoffs.append(timeout)
        return False

    def is_set(self) -> bool:
        return self.checks < 0


def supervise(monkeypatch, starts: list[bool], **options) -> Supervisor:
    monkeypatch.setattr(supervisor_module, "all_stub_pids", lambda pid: {})
    return Supervisor(ScriptedServer(starts), period_s=PERIOD_S, wedged_after_s=0, **options)


def test_failed_starts_wait_twice_as_long_each_time_up_to_the_limit(monkeypatch):
    supervisor = supervise(monkeypatch, [False] * 5 + [True], max_backoff_s=4, max_failed_starts=6)
    stop = ScriptedStop(checks=0)
    assert supervisor._restart(stop, 1.0) == 4
    assert stop.backoffs == [1, 2, 4, 4, 4]


def test_the_backoff_carries_over_a_short_run_and_resets_after_a_stable_one(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(supervisor_module.time, "monotonic", lambda: clock[0])
    # Each check of the run: seconds passed since the one before, and the problem it finds (None: serving).
    checks: Iterator[tuple[float, str | None]] = iter([
        (1, "a stub died"),  # restart: two failed starts (1 s, 2 s), then one that serves
        (10, None),  # served 10 s, less than stable_s
        (1, "a stub died"),  # restart: one failed start, still at 4 s
        (100, None),  # served 100 s: stable
        (1, "a stub died"),  # restart: one failed start, back at 1 s
    ])

    def problem() -> str | None:
        passed, found = next(checks)
        clock[0] += passed
        return found

    supervisor = supervise(monkeypatch, [False, False, True, False, True, False, True], stable_s=60,
                           max_failed_starts=5)
    monkeypatch.setattr(supervisor, "problem", problem)
    stop = ScriptedStop(checks=5)
    supervisor.run(stop)
    assert stop.backoffs == [1, 2, 4, 1]
    assert supervisor.restarts == 3


def test_it_gives_up_after_exactly_max_failed_starts_in_a_row(monkeypatch):
    server = ScriptedServer([False] * 4)
    supervisor = Supervisor(server, period_s=PERIOD_S, wedged_after_s=0, max_failed_starts=3)
    with pytest.raises(ServerError, match="did not come back in 3 attempts in a row; giving up"):
        supervisor._restart(ScriptedStop(checks=0), 1.0)
    assert len(list(server.starts)) == 1  # three of the four starts were made, not the fourth


def test_a_port_in_use_gives_up_at_once_since_starting_again_cannot_help():
    class PortTaken(ScriptedServer):
        def start(self) -> None:
            raise PortInUse("gRPC: 0.0.0.0:8001 is already in use")

    supervisor = Supervisor(PortTaken([]), period_s=PERIOD_S, wedged_after_s=0, max_failed_starts=5)
    stop = ScriptedStop(checks=0)
    with pytest.raises(ServerError, match="already in use; not restarting it"):
        supervisor._restart(stop, 1.0)
    assert stop.backoffs == []
