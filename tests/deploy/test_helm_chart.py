"""The Helm chart, rendered and linted by Helm's own library and every manifest validated by kubernetes-validate
--strict, for one GPU, tensor parallel 4 and a multi-node group (deploy/helm/examples/)."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tritonforge.cli import make_parser
from tritonforge.cli.build import build_options
from tritonforge.facts.settings import given
from tritonforge.serve.options import ServeOptions

from .chart import (
    ADAPTER_VALUES,
    CHART,
    CRD_KINDS,
    DASHBOARD,
    EXAMPLE_NAMES,
    INFERENCE_EXTENSION_VALUES,
    RECORDING_RULES,
    by_kind,
    container,
    example,
    helm,
    merged,
    one,
    pod_templates,
    render,
)

pytest.importorskip("helm_python", reason="helm-python-sdk (Helm's Go library for Python) is not installed: "
                                          "pip install -e .[test]")

# The Kubernetes versions the manifests are validated against: the chart's oldest (Chart.yaml's kubeVersion) and
# the newest kubernetes-validate knows.
OLDEST_KUBERNETES = re.search(r"(\d+\.\d+\.\d+)", yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"])[1]
KUBERNETES_VERSIONS = (OLDEST_KUBERNETES, None)
MINIMAL = {"repository": {"pvc": {"claimName": "repository"}}}


def kubernetes_validate() -> str:
    path = shutil.which("kubernetes-validate") or str(Path(sys.executable).with_name("kubernetes-validate"))
    if not os.access(path, os.X_OK):
        pytest.skip("kubernetes-validate is not installed: pip install -e .[test]")
    return path


# Other values than the examples', as a user's: each must render manifests that pass the same validation.
VARIANTS = {
    "tp2-pp2-ensemble": merged(MINIMAL, {
        "parallelism": {"tensor": 2, "pipeline": 2},
        "serve": {"openaiModel": "ensemble", "extraArgs": ["--log-file=/tmp/triton.log"]},
        "service": {"type": "LoadBalancer", "sessionAffinity": "ClientIP"},
        "podDisruptionBudget": {"enabled": False},
        "probes": {"liveness": {"enabled": False}},
    }),
    "other-ports-and-key": merged(MINIMAL, {
        "ports": {"http": 18000, "grpc": 18001, "metrics": 18002, "openai": 18080},
        "apiKey": {"value": "sk-x"},
        "monitoring": {"podMonitor": {"enabled": True}},
        "serviceAccount": {"create": False, "name": "existing"},
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
    }),
    "build-pp2-autoscaled": {
        "parallelism": {"pipeline": 2},
        "repository": {"source": "build",
                       "build": {"checkpointClaimName": "ckpt", "resources": {"requests": {"cpu": "4"}}}},
        "autoscaling": {"enabled": True, "maxReplicas": 8},
        "inferencePool": {"enabled": True},
    },
    "build-with-lora": {
        "repository": {"source": "build", "build": {"checkpointClaimName": "ckpt"}},
        "lora": {"claimName": "adapters", "subPath": "loras",
                 "adapters": [{"name": "sql", "path": "sql-v2"}, {"name": "chat", "path": "chat"}]},
    },
    "four-nodes-of-four": merged(MINIMAL, {
        "parallelism": {"tensor": 4, "pipeline": 4},
        "multiNode": {"enabled": True, "gpusPerNode": 4},
        "replicaCount": 3,
        "monitoring": {"podMonitor": {"enabled": True}, "dashboard": {"enabled": True}},
    }),
}


@pytest.fixture(scope="module", params=(*EXAMPLE_NAMES, *VARIANTS))
def rendered(request):
    return request.param, render(example(request.param) if request.param in EXAMPLE_NAMES else VARIANTS[request.param])


@pytest.mark.parametrize("name", (None, *EXAMPLE_NAMES))
def test_lint_finds_nothing_but_the_missing_icon(name):
    values = example(name) if name else MINIMAL
    report = helm().lint(str(CHART), values, strict=True, namespace="serving", kube_version="v1.34.0")
    assert report["errors"] == []
    findings = [m for m in report["messages"] if m["error"] != "icon is recommended"]
    assert findings == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_passes_kubernetes_validate_strict(rendered, version, tmp_path):
    name, manifests = rendered
    files = []
    for index, manifest in enumerate(manifests):
        if manifest["kind"] in CRD_KINDS:
            continue
        files.append(tmp_path / f"{index}-{manifest['kind']}.yaml")
        files[-1].write_text(yaml.safe_dump(manifest))
    # A LeaderWorkerSet's pods are PodTemplateSpecs: validate them as core PodTemplates, strictly too.
    for role, template in pod_templates(manifests).items():
        files.append(tmp_path / f"podtemplate-{role}.yaml")
        files[-1].write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "PodTemplate",
                                             "metadata": {"name": f"{name}-{role}"}, "template": template}))
    command = [kubernetes_validate(), "--strict", *(["-k", version] if version else []), *map(str, files)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARN" not in result.stdout + result.stderr  # no kind went unchecked
    assert result.stdout.count("passed") == len(files)


def test_the_crd_kinds_use_the_fields_their_apis_define(rendered):
    """No schema of Kubernetes' own covers them: their field names (from each project's API types) are checked."""
    _, manifests = rendered
    for monitor in by_kind(manifests, "PodMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "authorization"}
    for rule in by_kind(manifests, "PrometheusRule"):
        assert rule["apiVersion"] == "monitoring.coreos.com/v1" and set(rule["spec"]) == {"groups"}
    for pool in by_kind(manifests, "InferencePool"):
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
        assert set(pool["spec"]) == {"selector", "targetPorts", "endpointPickerRef"}
        assert set(pool["spec"]["endpointPickerRef"]) == {"name", "port", "failureMode"}
    for group in by_kind(manifests, "LeaderWorkerSet"):
        assert group["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        assert set(group["spec"]) <= {"replicas", "startupPolicy", "leaderWorkerTemplate"}
        assert set(group["spec"]["leaderWorkerTemplate"]) == {"size", "restartPolicy", "leaderTemplate",
                                                              "workerTemplate"}


@pytest.mark.parametrize("name, gpus_per_pod, pods_per_group", [("single-gpu", 1, 1), ("tp4", 4, 1),
                                                                 ("multinode", 8, 2)])
def test_each_pod_asks_for_its_share_of_tensor_times_pipeline_gpus(name, gpus_per_pod, pods_per_group):
    manifests = render(example(name))
    for template in pod_templates(manifests).values():
        resources = container(template)["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == str(gpus_per_pod)
    for group in by_kind(manifests, "LeaderWorkerSet"):
        assert group["spec"]["leaderWorkerTemplate"]["size"] == pods_per_group
    values = example(name)
    assert gpus_per_pod * pods_per_group == values.get("parallelism", {}).get("tensor", 1) * \
        values.get("parallelism", {}).get("pipeline", 1)


def test_the_examples_api_key_comes_from_their_secret():
    for name in EXAMPLE_NAMES:
        template = pod_templates(render(example(name)))["server"]
        env = {e["name"]: e for e in container(template)["env"]}
        assert env["TRITONFORGE_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "tritonforge-api-key",
                                                                            "key": "api-key"}


def test_the_serving_command_is_one_tritonforge_serve_accepts(rendered):
    _, manifests = rendered
    template = pod_templates(manifests)["server"]
    command = container(template)["command"]
    serve = command[command.index("tritonforge"):]
    args, options = serve_options(serve[1:])
    assert str(args.path) == "/models" and options.address == "0.0.0.0"
    assert options.api_key is None  # the key comes from the environment (a Secret), never the command line
    ports = {p["name"]: p["containerPort"] for p in container(template)["ports"]}
    assert ports == {"http": options.http_port, "grpc": options.grpc_port, "metrics": options.metrics_port,
                     "openai": options.openai_port}


def test_serve_stops_within_the_grace_period_left_after_the_prestop_sleep(rendered):
    """The kubelet's grace period counts from the preStop hook: serve's exit timeout is what is left of it after
    the hook's sleep, less a margin for serve's own exit, so that answers in flight get nearly all of it and the
    kubelet's SIGKILL never comes."""
    _, manifests = rendered
    template = pod_templates(manifests)["server"]
    serving = container(template)
    _, serve = serve_options(serving["command"][serving["command"].index("tritonforge") + 1:])
    grace = template["spec"]["terminationGracePeriodSeconds"]
    sleep = serving["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and serve.exit_timeout_s == grace - int(sleep[1]) - 5
    longer = merged(MINIMAL, {"terminationGracePeriodSeconds": 300, "preStopSleepSeconds": 0})
    serving = container(pod_templates(render(longer))["server"])
    assert "--exit-timeout-s=295" in serving["command"] and "lifecycle" not in serving


def serve_options(command: list[str]):
    """The parsed `tritonforge serve` command line and the options it gives (defaults included)."""
    args = make_parser().parse_args(command)
    return args, ServeOptions(**given(args, ServeOptions))


def test_probes_ask_the_gateway_for_readiness_and_a_generation_for_liveness(rendered):
    _, manifests = rendered
    serving = container(pod_templates(manifests)["server"])
    for probe in ("startupProbe", "readinessProbe"):
        assert serving[probe]["httpGet"] == {"path": "/health", "port": "openai"}
    if "livenessProbe" not in serving:
        return  # probes.liveness.enabled false
    probe = serving["livenessProbe"]
    args = make_parser().parse_args(probe["exec"]["command"][1:])
    _, serve = serve_options(serving["command"][serving["command"].index("tritonforge") + 1:])
    assert (args.url, args.model) == (f"127.0.0.1:{serve.grpc_port}", serve.openai_model)
    # The probe waits up to its --timeout-s, then up to 5 s to stop: the kubelet must wait longer.
    assert probe["timeoutSeconds"] > args.timeout_s + 5
    worker = pod_templates(manifests).get("worker")
    if worker:  # a worker serves nothing: no probe would tell the truth about it
        assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(container(worker))


def test_the_service_and_its_companions_select_only_serving_pods(rendered):
    _, manifests = rendered
    templates = pod_templates(manifests)
    serving_labels = templates["server"]["metadata"]["labels"]
    selectors = [one(manifests, "Service")["spec"]["selector"]]
    selectors += [m["spec"]["selector"]["matchLabels"] for m in by_kind(manifests, "PodDisruptionBudget")]
    selectors += [m["spec"]["selector"]["matchLabels"] for m in by_kind(manifests, "PodMonitor")]
    selectors += [m["spec"]["selector"]["matchLabels"] for m in by_kind(manifests, "InferencePool")]
    for selector in selectors:
        assert selector.items() <= serving_labels.items()
        if "worker" in templates:
            assert not selector.items() <= templates["worker"]["metadata"]["labels"].items()
    service_ports = {p["name"]: p["targetPort"] for p in one(manifests, "Service")["spec"]["ports"]}
    assert set(service_ports.values()) == {p["name"] for p in container(templates["server"])["ports"]}


def test_the_hpa_reads_the_metric_the_adapter_publishes():
    adapter = yaml.safe_load(ADAPTER_VALUES.read_text())
    published = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    for name, kind in (("tp4", "Deployment"), ("multinode", "LeaderWorkerSet")):
        manifests = render(example(name))
        hpa = one(manifests, "HorizontalPodAutoscaler")
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"]["kind"] == kind
        assert hpa["spec"]["scaleTargetRef"]["name"] == one(manifests, kind)["metadata"]["name"]
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in published
        # The HPA owns the replica count: the workload must not set it too.
        assert "replicas" not in one(manifests, kind)["spec"]


def test_the_inference_pool_sends_traffic_to_the_openai_port_and_the_picker_reads_metrics_elsewhere():
    manifests = render(example("tp4"))
    pool = one(manifests, "InferencePool")
    ports = {p["name"]: p["containerPort"] for p in container(pod_templates(manifests)["server"])["ports"]}
    assert pool["spec"]["targetPorts"] == [{"number": ports["openai"]}]
    extension = yaml.safe_load(INFERENCE_EXTENSION_VALUES.read_text())
    assert extension["inferencePool"]["modelServerType"] == "triton-tensorrt-llm"
    assert extension["inferencePool"]["targetPorts"] == [{"number": ports["openai"]}]
    assert extension["inferenceExtension"]["flags"]["model-server-metrics-port"] == ports["metrics"]
    serving_labels = pod_templates(manifests)["server"]["metadata"]["labels"]
    assert extension["inferencePool"]["modelServers"]["matchLabels"].items() <= serving_labels.items()


def test_the_rules_and_the_dashboard_are_shipped_as_the_files_that_are_tested():
    manifests = render(example("tp4"))
    rule = one(manifests, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RECORDING_RULES.read_text())
    (dashboard,) = [m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"].endswith("-dashboard")]
    assert json.loads(dashboard["data"]["tritonforge.json"]) == json.loads(DASHBOARD.read_text())
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_gateway_metrics_endpoint_is_scraped_with_the_api_key():
    monitor = one(render(example("tp4")), "PodMonitor")
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    assert "authorization" not in endpoints["metrics"]  # Triton's metrics port has no key
    assert endpoints["openai"]["authorization"] == {"type": "Bearer", "credentials": {"name": "tritonforge-api-key",
                                                                                        "key": "api-key"}}
    no_key = one(render(merged(example("tp4"), {"apiKey": {"existingSecret": ""}})), "PodMonitor")
    assert all("authorization" not in e for e in no_key["spec"]["podMetricsEndpoints"])


def test_a_key_given_as_a_value_becomes_a_secret_the_pod_reads():
    manifests = render(merged(MINIMAL, {"apiKey": {"value": "sk-1"}}))
    secret = one(manifests, "Secret")
    env = {e["name"]: e for e in container(pod_templates(manifests)["server"])["env"]}
    assert env["TRITONFORGE_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert "TRITONFORGE_API_KEY" not in {e["name"] for e in container(pod_templates(render(MINIMAL))["server"])["env"]}


def test_a_built_repository_is_built_by_an_init_container_for_the_same_path_and_ranks():
    manifests = render(example("tp4"))
    template = pod_templates(manifests)["server"]
    (build,) = template["spec"]["initContainers"]
    args = make_parser().parse_args(build["command"][1:])
    assert (str(args.model), str(args.output), str(args.repository_mount)) == ("/checkpoint", "/models", "/models")
    assert (args.tp_size, args.pp_size, args.force, args.quantization) == (4, 1, True, "fp8")
    assert build["resources"]["limits"]["nvidia.com/gpu"] == "4"
    mounts = {m["name"]: m for m in build["volumeMounts"]}
    assert not mounts["repository"].get("readOnly") and mounts["checkpoint"]["readOnly"]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert "emptyDir" in volumes["repository"] and volumes["checkpoint"]["persistentVolumeClaim"]["readOnly"]


def test_lora_adapters_on_a_claim_reach_the_build_as_lora_flags_in_their_order():
    template = pod_templates(render(VARIANTS["build-with-lora"]))["server"]
    (build,) = template["spec"]["initContainers"]
    assert build_options(make_parser().parse_args(build["command"][1:])).lora == ("sql=/lora/sql-v2", "chat=/lora/chat")
    mounts = {m["name"]: m for m in build["volumeMounts"]}
    assert mounts["lora"] == {"name": "lora", "mountPath": "/lora", "readOnly": True, "subPath": "loras"}
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["lora"]["persistentVolumeClaim"] == {"claimName": "adapters", "readOnly": True}
    # The repository carries what the build made of them: the server mounts no adapters.
    assert "lora" not in {m["name"] for m in container(template)["volumeMounts"]}


def test_without_adapters_the_build_gets_no_lora_flag_and_no_lora_volume():
    template = pod_templates(render(example("tp4")))["server"]
    (build,) = template["spec"]["initContainers"]
    assert not [argument for argument in build["command"] if argument.startswith("--lora")]
    assert "lora" not in {v["name"] for v in template["spec"]["volumes"]}


def test_shared_memory_and_tmp_are_memory_and_scratch_under_a_read_only_root():
    template = pod_templates(render(example("tp4")))["server"]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    serving = container(template)
    assert {m["mountPath"] for m in serving["volumeMounts"]} >= {"/dev/shm", "/tmp", "/models"}
    assert serving["securityContext"]["readOnlyRootFilesystem"] is True
    assert serving["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("override, message", [
    ({"parallelism": {"tensor": 0}}, "/parallelism/tensor"),
    ({"autoscalng": {"enabled": True}}, "additional properties 'autoscalng'"),
    ({"serve": {"openaiModel": "tensorrt_llm"}}, "/serve/openaiModel"),
    ({"ports": {"openai": 70000}}, "/ports/openai"),
    ({"shm": {"sizeLimit": "two gigs"}}, "/shm/sizeLimit"),
    ({"repository": {"source": "s3"}}, "/repository/source"),
    ({"preStopSleepSeconds": -1}, "/preStopSleepSeconds"),
    ({"lora": {"adapters": [{"name": "a b", "path": "x"}]}}, "/lora/adapters/0/name"),
    ({"lora": {"adapters": [{"name": "a", "path": "/abs"}]}}, "/lora/adapters/0/path"),
])
def test_the_schema_refuses_a_bad_value_naming_it(override, message):
    with pytest.raises(helm().HelmValuesError, match=message):
        render(merged(MINIMAL, override))


@pytest.mark.parametrize("values, message", [
    ({}, "repository.pvc.claimName"),
    ({"repository": {"source": "build"}}, "checkpointClaimName"),
    (merged(MINIMAL, {"multiNode": {"enabled": True}, "parallelism": {"tensor": 12}}), "not a multiple"),
    (merged(MINIMAL, {"multiNode": {"enabled": True}, "parallelism": {"tensor": 8}}), "fits on one node"),
    ({"multiNode": {"enabled": True}, "parallelism": {"tensor": 16},
      "repository": {"source": "build", "build": {"checkpointClaimName": "c"}}}, "multiNode needs repository"),
    (merged(MINIMAL, {"apiKey": {"existingSecret": "s", "value": "v"}}), "not both"),
    (merged(MINIMAL, {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}), "minReplicas"),
    (merged(MINIMAL, {"terminationGracePeriodSeconds": 15}), r"leaves tritonforge serve 5 s to stop"),
    (merged(MINIMAL, {"lora": {"claimName": "a", "adapters": [{"name": "a", "path": "a"}]}}),
     "lora.adapters needs repository.source=build"),
    ({"repository": {"source": "build", "build": {"checkpointClaimName": "c"}},
      "lora": {"adapters": [{"name": "a", "path": "a"}]}}, "lora.adapters needs lora.claimName"),
])
def test_the_chart_refuses_values_that_cannot_work_together(values, message):
    with pytest.raises(helm().HelmRenderError, match=message):
        render(values)


def test_the_leader_launcher_writes_one_hostfile_line_per_group_pod_and_runs_serve(tmp_path):
    """files/launch-leader.sh run by a real shell, with stand-ins for kubectl and hostname that record their calls."""
    manifests = render(example("multinode"))
    scripts = one(manifests, "ConfigMap")["data"]
    leader = container(pod_templates(manifests)["server"])
    assert leader["command"][:2] == ["/bin/sh", "/opt/tritonforge-mpi/launch-leader.sh"]
    env = {e["name"]: e["value"] for e in leader["env"] if "value" in e}
    assert env["OMPI_MCA_orte_default_hostfile"] == env["TRITONFORGE_MPI_HOSTFILE"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name, body in (("kubectl", f'echo "$@" >> {calls}\n'), ("hostname", "echo llm-tritonforge-0\n")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}")
        (bin_dir / name).chmod(stat.S_IRWXU)
    launcher = tmp_path / "launch-leader.sh"
    launcher.write_text(scripts["launch-leader.sh"])
    hostfile = tmp_path / "mpi" / "hostfile"
    run_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "LWS_GROUP_SIZE": "3",
               "TRITONFORGE_GPUS_PER_NODE": "8", "TRITONFORGE_MPI_HOSTFILE": str(hostfile),
               "TRITONFORGE_KUBECTL": str(bin_dir / "kubectl")}
    result = subprocess.run(["/bin/sh", str(launcher), "echo", "serving"], env=run_env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "serving"
    assert hostfile.read_text().splitlines() == ["llm-tritonforge-0 slots=8", "llm-tritonforge-0-1 slots=8",
                                                 "llm-tritonforge-0-2 slots=8"]
    assert calls.read_text().splitlines() == [f"exec llm-tritonforge-0-{i} -c tritonforge -- true" for i in (1, 2)]
    agent = tmp_path / "kubexec.sh"
    agent.write_text(scripts["kubexec.sh"])
    calls.unlink()
    subprocess.run(["/bin/sh", str(agent), "llm-tritonforge-0-1.llm-tritonforge.serving", "orted", "-mca", "x"],
                   env=run_env, check=True, timeout=30)
    assert calls.read_text().splitlines() == ["exec -i llm-tritonforge-0-1 -c tritonforge -- /bin/sh -c orted -mca x"]
