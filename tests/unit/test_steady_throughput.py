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
