"""The accuracy gate's verdict on measured figures: each threshold fails the engine that crosses it, in the
direction that means worse, and `tritonforge eval` exits 1 on a failed verdict."""

from __future__ import annotations

import dataclasses

import pytest

from tritonforge.tools import accuracy
from tritonforge.tools.accuracy import Report, Thresholds

AGREEING = Report(prompts=16, tokens=32, greedy_agreement=1.0, mean_first_divergence=32.0, logprob_mae=0.01,
                  logprob_off_share=0.0, task_accuracy_served=0.80, task_accuracy_reference=0.80)


def verdict(**figures) -> list[str]:
    report = dataclasses.replace(AGREEING, **figures, failures=[])
    accuracy._judge(report, Thresholds())
    return report.failures


def test_an_engine_that_answers_like_its_checkpoint_passes():
    assert verdict() == []


@pytest.mark.parametrize(("figures", "failure"), [
    ({"greedy_agreement": 0.85}, "greedy agreement 0.850 < 0.9"),
    ({"logprob_mae": 0.06}, "log-prob MAE 0.0600 > 0.05"),
    ({"logprob_off_share": 0.08}, "0.080 of tokens off by > 0.1 (allowed 0.05)"),
    ({"logprob_mae": None, "logprob_off_share": None}, "the served engine returned no output_log_probs"),
    ({"task_accuracy_served": 0.75}, "task accuracy 0.750 trails the reference's 0.800 by more than 0.02")])
def test_each_figure_past_its_threshold_fails_the_engine_naming_it(figures, failure):
    assert verdict(**figures) == [failure]


def test_what_is_better_than_the_checkpoint_or_at_a_threshold_passes():
    """A served engine that scores higher on the task than its checkpoint (noise of a small set) passes, as
    do figures at their thresholds."""
    assert verdict(task_accuracy_served=0.90) == []
    assert verdict(greedy_agreement=0.9, logprob_mae=0.05, logprob_off_share=0.05, task_accuracy_served=0.79) == []


@pytest.mark.parametrize(("failures", "status"), [([], 0), (["greedy agreement 0.500 < 0.9"], 1)])
def test_eval_exits_1_when_the_verdict_fails(monkeypatch, capsys, tmp_path, failures, status):
    from tritonforge.cli import main

    report = dataclasses.replace(AGREEING, failures=failures)
    monkeypatch.setattr(accuracy, "run_eval", lambda *args, **kwargs: report)
    assert main(["eval", "--url", "127.0.0.1:1", "--reference", str(tmp_path)]) == status
    assert ("FAIL" in capsys.readouterr().out) is bool(failures)
