"""The recording rules, prometheus-adapter's queries and the dashboard's expressions, checked and evaluated by
Debian's promtool (`promtool check rules`, `promtool test rules`) over series shaped as a tritonforge pod
publishes them (Triton's nv_* families, the gateway's tritonforge_* ones) with the labels a PodMonitor adds."""

import json
import re

import yaml

from tritonforge.gateway.metrics import ITL_METRIC, TTFT_METRIC
from tritonforge.runtime.engine.metrics import KV_BLOCK_TYPES, REQUEST_TYPES

from .chart import DASHBOARD, RECORDING_RULES
from .prometheus import adapter_metrics_query, adapter_rule, adapter_rules, promtool

# What a pod publishes (Triton's per-model counters, both engines' families, the gateway's): the only names the
# rules and the dashboard may read.
PUBLISHED = {"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics", "nv_inference_request_success",
             "nv_inference_request_failure", "nv_inference_queue_duration_us",
             "nv_inference_compute_infer_duration_us", f"{TTFT_METRIC}_bucket", f"{ITL_METRIC}_bucket",
             "tritonforge_requests_total", "tritonforge_requests_in_flight", "tritonforge_completion_tokens_total",
             "tritonforge_prompt_tokens_total"}
POD_A, POD_B = "llm-tritonforge-6d9f-a", "llm-tritonforge-6d9f-b"


def _engine_series(pod: str, request_type: str, values: str, model: str = "tensorrt_llm") -> dict:
    return {"series": f'nv_trt_llm_request_metrics{{namespace="serving",pod="{pod}",container="tritonforge",'
                      f'model="{model}",version="1",request_type="{request_type}"}}', "values": values}


def _run_tests(tmp_path, tests: list[dict], rule_files=(RECORDING_RULES,)) -> None:
    path = tmp_path / "rules_test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(f) for f in rule_files], "evaluation_interval": "15s",
                                    "tests": tests}))
    result = promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_recording_rules():
    result = promtool("check", "rules", RECORDING_RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_refuses_a_broken_rule(tmp_path):
    """The check above can fail: a rule that does not parse is refused."""
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "x:y", "expr": "sum by (("}]}]}))
    assert promtool("check", "rules", broken).returncode != 0


def test_waiting_requests_are_summed_per_pod_over_its_models_and_other_request_types_left_out(tmp_path):
    series = [_engine_series(POD_A, "waiting", "0 3 5"), _engine_series(POD_A, "waiting", "0 1 2", model="other"),
              _engine_series(POD_A, "scheduled", "8 8 8"), _engine_series(POD_A, "active", "8 12 15"),
              _engine_series(POD_B, "waiting", "0 0 1"), _engine_series(POD_B, "max", "8 8 8")]
    _run_tests(tmp_path, [{"interval": "15s", "input_series": series, "promql_expr_test": [
        {"expr": "tritonforge:engine_waiting_requests:sum", "eval_time": "30s", "exp_samples": [
            {"labels": f'tritonforge:engine_waiting_requests:sum{{namespace="serving",pod="{POD_A}"}}', "value": 7},
            {"labels": f'tritonforge:engine_waiting_requests:sum{{namespace="serving",pod="{POD_B}"}}', "value": 1}]},
        {"expr": "tritonforge:engine_waiting_requests:sum_by_namespace", "eval_time": "30s", "exp_samples": [
            {"labels": 'tritonforge:engine_waiting_requests:sum_by_namespace{namespace="serving"}', "value": 8}]},
        {"expr": "tritonforge:engine_max_requests:sum", "eval_time": "30s", "exp_samples": [
            {"labels": f'tritonforge:engine_max_requests:sum{{namespace="serving",pod="{POD_B}"}}', "value": 8}]},
    ]}])


def test_kv_cache_fraction_is_the_busiest_models_share(tmp_path):
    def blocks(kind, values, model="tensorrt_llm"):
        return {"series": f'nv_trt_llm_kv_cache_block_metrics{{namespace="serving",pod="{POD_A}",model="{model}",'
                          f'version="1",kv_cache_block_type="{kind}"}}', "values": values}

    series = [blocks("fraction", "0.25 0.5"), blocks("fraction", "0.75 0.125", model="other"), blocks("used", "9 9")]
    _run_tests(tmp_path, [{"interval": "15s", "input_series": series, "promql_expr_test": [
        {"expr": "tritonforge:kv_cache_used:fraction", "eval_time": "15s", "exp_samples": [
            {"labels": f'tritonforge:kv_cache_used:fraction{{namespace="serving",pod="{POD_A}"}}', "value": 0.5}]}]}])


def test_queue_to_compute_ratio_and_request_rate_per_model(tmp_path):
    def counter(name, values):
        return {"series": f'{name}{{namespace="serving",pod="{POD_A}",model="ensemble",version="1"}}',
                "values": values}

    # Per 15 s: 300 ms queued, 100 ms computing, 30 requests. rate() over 1m extrapolates each alike.
    series = [counter("nv_inference_queue_duration_us", "0+300000x8"),
              counter("nv_inference_compute_infer_duration_us", "0+100000x8"),
              counter("nv_inference_request_success", "0+30x8")]
    _run_tests(tmp_path, [{"interval": "15s", "input_series": series, "promql_expr_test": [
        {"expr": "tritonforge:triton_queue_compute:ratio", "eval_time": "2m", "exp_samples": [
            {"labels": f'tritonforge:triton_queue_compute:ratio{{namespace="serving",pod="{POD_A}",model="ensemble"}}',
             "value": 3}]},
        {"expr": "tritonforge:triton_requests:rate1m", "eval_time": "2m", "exp_samples": [
            {"labels": f'tritonforge:triton_requests:rate1m{{namespace="serving",pod="{POD_A}",model="ensemble"}}',
             "value": 2}]},
    ]}])


def test_time_to_first_token_p90_comes_from_the_gateways_histogram(tmp_path):
    # 100 first tokens a minute, every one under 0.1 s and none under 0.05 s: the p90 lies in (0.05, 0.1].
    buckets = {"0.05": "0+0x8", "0.1": "0+25x8", "+Inf": "0+25x8"}
    series = [{"series": f'{TTFT_METRIC}_bucket{{namespace="serving",pod="{POD_A}",le="{le}"}}', "values": values}
              for le, values in buckets.items()]
    _run_tests(tmp_path, [{"interval": "15s", "input_series": series, "promql_expr_test": [
        {"expr": "tritonforge:time_to_first_token_seconds:p90_1m", "eval_time": "2m", "exp_samples": [
            {"labels": 'tritonforge:time_to_first_token_seconds:p90_1m{namespace="serving"}', "value": 0.095}]}]}])


def test_the_adapters_query_gives_each_pod_its_waiting_requests(tmp_path):
    rule = adapter_rule("tritonforge_engine_waiting_requests")
    query = adapter_metrics_query(rule, "serving", [POD_A, POD_B])
    series = [_engine_series(POD_A, "waiting", "4"), _engine_series(POD_A, "waiting", "1", model="other"),
              _engine_series(POD_A, "scheduled", "8"), _engine_series(POD_B, "waiting", "0"),
              _engine_series("another-release-pod", "waiting", "50")]
    _run_tests(tmp_path, [{"interval": "15s", "input_series": series, "promql_expr_test": [
        {"expr": query, "eval_time": "0s", "exp_samples": [
            {"labels": f'{{pod="{POD_A}"}}', "value": 5}, {"labels": f'{{pod="{POD_B}"}}', "value": 0}]},
        # The series the adapter discovers: only the waiting ones, and only those a scrape labelled with a pod.
        {"expr": rule["seriesQuery"], "eval_time": "0s", "exp_samples": [
            {"labels": s["series"]} | {"value": float(s["values"])} for s in series
            if 'request_type="waiting"' in s["series"]]},
    ]}], rule_files=())


def test_every_adapter_rule_maps_namespace_and_pod_and_its_query_parses(tmp_path):
    rules = {"groups": [{"name": "adapter", "rules": []}]}
    for rule in adapter_rules():
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert re.match(rule["name"]["matches"], rule["seriesQuery"].split("{")[0])
        rules["groups"][0]["rules"].append({"record": f"adapter:{rule['name']['as']}",
                                            "expr": adapter_metrics_query(rule, "serving", [POD_A])})
    path = tmp_path / "adapter.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def _metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    words = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[|\))", without_strings))
    return {w for w in words if w.startswith(("nv_", "tritonforge_"))}


def test_the_dashboards_queries_parse_and_read_only_published_metrics(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) >= 12
    # Grafana's variables, as Grafana fills them in before a query is sent.
    queries = [e.replace("$__rate_interval", "1m").replace("$namespace", "serving") for e in exprs]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:panel_{i}", "expr": q}
                                                        for i, q in enumerate(queries)]}]}
    path = tmp_path / "dashboard.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    read = set().union(*map(_metric_names, queries))
    assert read <= PUBLISHED and {"nv_trt_llm_request_metrics", f"{TTFT_METRIC}_bucket"} <= read


def test_the_recording_rules_read_only_published_metrics_and_labels_the_engines_use():
    rules = yaml.safe_load(RECORDING_RULES.read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert set().union(*map(_metric_names, exprs)) <= PUBLISHED
    used_types = set(re.findall(r'request_type="(\w+)"', " ".join(exprs)))
    used_blocks = set(re.findall(r'kv_cache_block_type="(\w+)"', " ".join(exprs)))
    assert used_types <= set(REQUEST_TYPES) and used_blocks <= set(KV_BLOCK_TYPES)
