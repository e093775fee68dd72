"""Rendering the Helm chart with Helm's own Go library (PyPI's helm-python-sdk: no binary, no cluster), shared by
the deploy tests."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "tritonforge"
EXAMPLES = ROOT / "deploy" / "helm" / "examples"
ADAPTER_VALUES = ROOT / "deploy" / "prometheus-adapter" / "values.yaml"
INFERENCE_EXTENSION_VALUES = ROOT / "deploy" / "inference-extension" / "values.yaml"
RECORDING_RULES = CHART / "rules" / "recording.yaml"
DASHBOARD = CHART / "dashboards" / "tritonforge.json"
RELEASE, NAMESPACE = "llm", "serving"
EXAMPLE_NAMES = ("single-gpu", "tp4", "multinode")
# The kinds that come from CRDs (prometheus-operator, LeaderWorkerSet, the inference extension): no schema of
# Kubernetes' own covers them.
CRD_KINDS = {"PodMonitor", "PrometheusRule", "LeaderWorkerSet", "InferencePool"}


def helm():
    import helm_python  # imported here: a missing package is reported by the test that needs it

    return helm_python


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())


def merged(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def render(values: dict) -> list[dict]:
    """Every manifest the chart renders for `values`, as objects."""
    chart = helm().Chart.load(str(CHART))
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def by_kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[dict], kind: str) -> dict:
    found = by_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_templates(manifests: list[dict]) -> dict[str, dict]:
    """The pod templates of the workloads: {"server": ..., "worker": ...} (a Deployment has no worker)."""
    templates = {}
    for manifest in manifests:
        if manifest["kind"] == "Deployment":
            templates["server"] = manifest["spec"]["template"]
        elif manifest["kind"] == "LeaderWorkerSet":
            group = manifest["spec"]["leaderWorkerTemplate"]
            templates["server"], templates["worker"] = group["leaderTemplate"], group["workerTemplate"]
    return templates


def container(template: dict, name: str = "tritonforge") -> dict:
    return next(c for c in template["spec"]["containers"] if c["name"] == name)
