"""A pytest plugin for long runs (scripts/test.sh loads it with `-p tests.progress`): one line per test module as it
ends, instead of a dot per test, so that a person sees what ran, how long it took and how far the run is:

    tests/integration/test_bls.py: 31 passed in 74.2 s  [812/2367 tests, 4:51]

It works in one process and under xdist (the controller gets every report). A failing test still prints pytest's
own `F` (and its report at the end); a module's line says how many failed or were skipped."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pytest


class ModuleProgress:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.started = time.monotonic()
        self.totals: Counter[str] = Counter()
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.first_seen: dict[str, float] = {}
        self.done = 0

    def _collected(self, nodeids) -> None:
        if not self.totals:  # each xdist worker collects the same tests: counted once
            self.totals.update(nodeid.split("::", 1)[0] for nodeid in nodeids)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._collected(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self._collected(ids)

    def pytest_report_teststatus(self, report, config):
        if report.passed and report.when == "call" or report.skipped:
            return report.outcome, "", report.outcome.upper()  # no dot: the module's line counts it
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.first_seen.setdefault(module, time.monotonic())
        if report.failed or (report.skipped and report.when != "teardown"):
            self.outcomes[module]["failed" if report.failed else "skipped"] += 1
        elif report.passed and report.when == "call":
            self.outcomes[module]["passed"] += 1
        if report.when != "teardown":
            return
        self.done += 1
        counted = self.outcomes[module]
        if sum(counted[kind] for kind in ("passed", "skipped")) + counted["failed"] < self.totals.get(module, 0):
            return
        elapsed = time.monotonic() - self.started
        parts = ", ".join(f"{counted[kind]} {kind}" for kind in ("passed", "failed", "skipped") if counted[kind])
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        reporter.ensure_newline()
        reporter.write_line(f"{module}: {parts} in {time.monotonic() - self.first_seen[module]:.1f} s  "
                            f"[{self.done}/{sum(self.totals.values())} tests, {int(elapsed // 60)}:"
                            f"{int(elapsed % 60):02d}]")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or the one process) reports; workers send to it
        config.pluginmanager.register(ModuleProgress(config), "module-progress")
