"""The tuner's choice and its config rewriting, on measured-looking rows."""

from dataclasses import asdict

from tritonforge.builder.build import BuildOptions, build
from tritonforge.tools.tuning import Candidate, apply, choose, current, grid

SMALL, LARGE, SLOW = Candidate(2, 4, 4, 0), Candidate(4, 8, 8, 0), Candidate(2, 4, 4, 500)


def rows_for(candidate, ensemble, bls, ttft_p99=50.0, errors=0):
    base = {"candidate": asdict(candidate), "errors": errors, "ttft_ms_p99": ttft_p99}
    return [{**base, "path": "direct", "efficiency": None, "errors": 0},
            {**base, "path": "ensemble", "efficiency": ensemble}, {**base, "path": "bls", "efficiency": bls}]


def test_the_fewest_instances_that_reach_the_target_win():
    rows = rows_for(SMALL, 0.96, 0.95) + rows_for(LARGE, 0.99, 0.99)
    assert choose(rows, [SMALL, LARGE], 0.95) == (SMALL, True)


def test_a_path_below_the_target_or_an_error_disqualifies():
    rows = rows_for(SMALL, 0.99, 0.90) + rows_for(LARGE, 0.97, 0.96)
    assert choose(rows, [SMALL, LARGE], 0.95) == (LARGE, True)
    rows = rows_for(SMALL, 0.99, 0.99, errors=3) + rows_for(LARGE, 0.97, 0.96)
    assert choose(rows, [SMALL, LARGE], 0.95) == (LARGE, True)


def test_fewer_instances_win_over_a_lower_ttft_p99():
    # instances are what a candidate costs the machine; TTFT only separates candidates of equal cost
    rows = rows_for(SMALL, 0.97, 0.97, ttft_p99=80.0) + rows_for(LARGE, 0.97, 0.97, ttft_p99=40.0)
    assert choose(rows, [SMALL, LARGE], 0.95) == (SMALL, True)


def test_equal_instances_are_separated_by_ttft_p99():
    rows = rows_for(SMALL, 0.97, 0.97, ttft_p99=80.0) + rows_for(SLOW, 0.97, 0.97, ttft_p99=40.0)
    assert choose(rows, [SMALL, SLOW], 0.95) == (SLOW, True)


def test_a_candidate_without_a_ttft_p99_ranks_below_one_with_a_measured_ttft_p99():
    rows = rows_for(SMALL, 0.97, 0.97, ttft_p99=None) + rows_for(SLOW, 0.97, 0.97, ttft_p99=40.0)
    assert choose(rows, [SMALL, SLOW], 0.95) == (SLOW, True)


def test_when_none_reaches_the_target_the_best_worst_path_is_kept():
    rows = rows_for(SMALL, 0.99, 0.70) + rows_for(LARGE, 0.85, 0.84)
    assert choose(rows, [SMALL, LARGE], 0.95) == (LARGE, False)


def test_the_steady_efficiency_decides_when_every_path_has_one():
    rows = rows_for(SMALL, 0.97, 0.96) + rows_for(LARGE, 0.97, 0.96)
    steady = {(SMALL, "ensemble"): 0.90, (SMALL, "bls"): 0.96, (LARGE, "ensemble"): 0.97, (LARGE, "bls"): 0.96}
    for row in rows:
        row["steady_efficiency"] = steady.get((Candidate(**row["candidate"]), row["path"]))
    assert choose(rows, [SMALL, LARGE], 0.95) == (LARGE, True)
    rows[1]["steady_efficiency"] = None  # one path without a steady window: the whole runs decide, for all
    assert choose(rows, [SMALL, LARGE], 0.95) == (SMALL, True)


def test_grid_is_every_combination():
    assert len(grid([2, 4], [4, 8], [4], [0, 200])) == 8


def test_apply_rewrites_counts_and_the_postprocessing_delay(tiny_models, tmp_path):
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=64,
                                    max_seq_len=256))
    apply(repository, Candidate(3, 5, 2, 250))
    assert current(repository) == Candidate(3, 5, 2, 250)


def test_equal_instances_are_separated_by_their_slowest_paths_ttft_p99():
    """SMALL's ensemble answers first sooner than SLOW's, but its BLS later than either of SLOW's paths."""
    rows = rows_for(SMALL, 0.97, 0.97) + rows_for(SLOW, 0.97, 0.97, ttft_p99=60.0)
    for row in rows[:3]:
        row["ttft_ms_p99"] = {"direct": 10.0, "ensemble": 40.0, "bls": 90.0}[row["path"]]
    assert choose(rows, [SMALL, SLOW], 0.95) == (SLOW, True)


def test_a_ctrl_c_during_a_measurement_puts_the_configs_back(tiny_models, tmp_path, monkeypatch):
    import pytest

    from tritonforge.tools import tuning

    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=64,
                                    max_seq_len=256))
    before = {path: path.read_text() for path in repository.glob("*/config.pbtxt")}

    class Interrupted:
        def __init__(self, *args, **kwargs):
            pass

        def start(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(tuning, "TritonServer", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        tuning.tune(repository, [LARGE], prompts=4)
    assert {path: path.read_text() for path in repository.glob("*/config.pbtxt")} == before
