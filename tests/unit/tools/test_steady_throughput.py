"""The steady-state throughput of a closed-loop benchmark run leaves out its ramp and its drain."""

from tritonforge.tools.benchmark import Timing, steady_tokens_per_s, summarize

TOKENS = 64


def closed_loop(request_s: list[float], deadline_s: float) -> list[Timing]:
    """One stream per entry of `request_s` (its requests' duration): each sends its next request when the
    previous one completes, as long as the deadline has not passed; what is in flight then still completes."""
    timings = []
    for duration in request_s:
        sent = 0.0
        while sent < deadline_s:
            timings.append(Timing(sent=sent, arrivals=[sent + duration / 2, sent + duration], tokens=TOKENS))
            sent += duration
    return timings


def test_the_steady_rate_is_the_loop_rate_the_whole_run_rate_is_not():
    durations = [0.6 + 0.05 * stream for stream in range(16)]  # 0.6 .. 1.35 s, as streams that queue
    timings = closed_loop(durations, deadline_s=4.0)
    loop_rate = sum(TOKENS / duration for duration in durations)
    steady = steady_tokens_per_s(timings, len(durations))
    assert abs(steady - loop_rate) / loop_rate < 0.05
    wall = max(t.arrivals[-1] for t in timings) - min(t.sent for t in timings)
    whole = summarize(timings, wall_s=wall, concurrency=len(durations))
    assert whole["output_tokens_per_s"] < 0.9 * loop_rate  # the drain past the deadline counts as run time
    assert whole["steady_output_tokens_per_s"] == steady


def test_a_run_too_short_for_a_steady_window_has_none():
    short = closed_loop([0.5] * 8, deadline_s=0.4)
    assert steady_tokens_per_s(short, 8) is None
    assert summarize(short, wall_s=0.5, concurrency=8)["steady_output_tokens_per_s"] is None


def test_the_summary_figures_are_the_percentiles_of_first_token_and_inter_token_times():
    """100 requests of 5 tokens: the i-th answers first after i ms, then a token every 2 ms (4 gaps)."""
    timings = [Timing(sent=0.0, arrivals=[i / 1000 + gap * 0.002 for gap in range(5)], tokens=5)
               for i in range(1, 101)]
    timings.append(Timing(sent=0.0, arrivals=[], tokens=0, error="UNAVAILABLE"))
    summary = summarize(timings, wall_s=2.0)
    assert (summary["requests"], summary["errors"], summary["first_error"]) == (100, 1, "UNAVAILABLE")
    assert summary["output_tokens_per_s"] == 250.0  # 500 tokens in 2 s
    assert (summary["ttft_ms_p50"], summary["ttft_ms_p99"]) == (50.5, 99.01)
    assert summary["itl_ms_p50"] == summary["itl_ms_p99"] == 2.0


def test_a_paths_efficiency_is_its_throughput_over_the_engine_called_directly():
    from tritonforge.tools.benchmark import add_efficiency

    rows = [{"engine": "replay", "concurrency": 128, "path": path, "output_tokens_per_s": rate,
             "steady_output_tokens_per_s": steady} for path, rate, steady in
            [("direct", 1000.0, 1100.0), ("ensemble", 950.0, 1078.0), ("bls", 900.0, None)]]
    add_efficiency(rows)
    assert [(row["efficiency"], row["steady_efficiency"]) for row in rows] == [(1.0, 1.0), (0.95, 0.98), (0.9, None)]
