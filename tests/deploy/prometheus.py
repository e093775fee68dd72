"""Debian's Prometheus tools for the deploy tests: promtool, and prometheus-adapter's query templates expanded the
way the adapter expands them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .chart import ADAPTER_VALUES

INSTALL_HINT = "apt-get install prometheus (Debian's package: promtool and prometheus)"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not found on PATH: {INSTALL_HINT}")
    return path


def promtool(*args: str | Path, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *map(str, args)], capture_output=True, text=True, timeout=timeout_s)


def adapter_rules() -> list[dict]:
    return yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]


def adapter_rule(published_name: str) -> dict:
    return next(rule for rule in adapter_rules() if rule["name"]["as"] == published_name)


def adapter_metrics_query(rule: dict, namespace: str, pods: list[str]) -> str:
    """The PromQL prometheus-adapter sends when the HPA asks for `pods` of `namespace`: its metricsQuery with
    <<.Series>> the series' name, <<.LabelMatchers>> the namespace and pod matchers, <<.GroupBy>> the pod label
    (the resource the HPA asked for)."""
    series = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"].strip("'")).group(1)
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    values = {"Series": series, "LabelMatchers": matchers, "GroupBy": "pod"}
    query = re.sub(r"<<\s*\.(\w+)\s*>>", lambda m: values[m.group(1)], rule["metricsQuery"])
    assert "<<" not in query, f"a template field the adapter fills is not handled here: {query}"
    return query
