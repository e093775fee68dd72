"""A rendered pod's serving container started and probed as the kubelet does it, for the tests that run the
chart's pod against a real tritonserver."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..deploy.chart import container, pod_templates


class Pod:
    """One rendered pod's serving container, started and probed as the kubelet would."""

    def __init__(self, manifests: list[dict], work_dir: Path):
        self.template = pod_templates(manifests)["server"]
        self.container = container(self.template)
        secrets = {s["metadata"]["name"]: s["data"] for s in manifests if s["kind"] == "Secret"}
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        for item in self.container["env"]:
            if "value" in item:
                self.env[item["name"]] = item["value"]
            else:
                ref = item["valueFrom"]["secretKeyRef"]
                self.env[item["name"]] = base64.b64decode(secrets[ref["name"]][ref["key"]]).decode()
        self.env["HOME"] = str(work_dir)  # the pod's /tmp emptyDir; this machine's /tmp is shared
        self.ports = {p["name"]: p["containerPort"] for p in self.container["ports"]}
        self.log_path = work_dir / "pod.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.container["command"], env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.log_path.parent)

    def log(self, since: int = 0) -> str:
        """The container's output from byte `since` on (`log_size()` taken earlier), its last 4000 characters."""
        return self.log_path.read_bytes()[since:].decode(errors="replace")[-4000:]

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def probe(self, name: str) -> bool:
        """One run of a probe, with the kubelet's rules: httpGet succeeds on 200-399 within timeoutSeconds
        (default 1), exec on exit status 0 within timeoutSeconds."""
        probe = self.container[name]
        timeout_s = probe.get("timeoutSeconds", 1)
        if "exec" in probe:
            try:
                return subprocess.run(probe["exec"]["command"], env=self.env, capture_output=True,
                                      timeout=timeout_s).returncode == 0
            except subprocess.TimeoutExpired:
                return False
        get = probe["httpGet"]
        port = self.ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{get['path']}", timeout=timeout_s) as response:
                return 200 <= response.status < 400
        except (OSError, urllib.error.HTTPError):
            return False

    def wait_until(self, name: str, expected: bool, budget_s: float | None = None) -> float:
        """Run probe `name` at its period until it answers `expected`; the seconds it took. The budget is the
        kubelet's (period × failure threshold) unless given."""
        probe = self.container[name]
        period_s = probe.get("periodSeconds", 10)
        budget_s = budget_s or period_s * probe.get("failureThreshold", 3)
        started = time.monotonic()
        while self.probe(name) != expected:
            assert self.process.poll() is None, f"the container exited ({self.process.returncode}):\n{self.log()}"
            assert time.monotonic() - started < budget_s, f"{name} not {expected} after {budget_s} s:\n{self.log()}"
            time.sleep(period_s)  # the probe's own period, as the kubelet waits between runs
        return time.monotonic() - started

    def terminate(self) -> float:
        """As the kubelet stops a container: its preStop hook, then SIGTERM, then SIGKILL once the grace period,
        counted from the hook's start, is over; seconds it took."""
        grace_s = self.template["spec"]["terminationGracePeriodSeconds"]
        started = time.monotonic()
        hook = self.container.get("lifecycle", {}).get("preStop", {}).get("exec")
        if hook and self.process.poll() is None:
            try:
                subprocess.run(hook["command"], env=self.env, timeout=grace_s, check=False)
            except subprocess.TimeoutExpired:
                pass
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=max(grace_s - (time.monotonic() - started), 0))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return time.monotonic() - started
