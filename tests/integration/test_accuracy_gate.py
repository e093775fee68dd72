"""The accuracy gate on the transformers engine: the tiny model against itself passes; degraded copies
fail, and worse copies score worse."""

import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.facts.contract import ENGINE_MODEL
from tritonforge.serve.server import only_models
from tritonforge.tools.accuracy import DEFAULT_PROMPTS, Thresholds, run_eval
from tritonforge.tools.tiny_model import degraded_copy

from .conftest import running

TOKENS = 16


def served_eval(checkpoint, reference, tmp_path, name):
    repository = build(BuildOptions(model=checkpoint, output=tmp_path / name, max_input_len=64, max_seq_len=256),
                       progress=lambda _: None)
    # Six of the built-in prompts keep the four evaluations of this module short.
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(DEFAULT_PROMPTS.read_text().splitlines(keepends=True)[:6]))
    with running(repository, extra_args=only_models(ENGINE_MODEL)) as server:  # the one model the eval asks
        return run_eval(server.grpc_url, reference, repository / "preprocessing" / "tokenizer", tokens=TOKENS,
                        prompts_path=prompts)


@pytest.fixture(scope="module")
def reports(tiny_models, tmp_path_factory):
    reference = tiny_models["bpe"]
    work = tmp_path_factory.mktemp("accuracy")
    copies = {"identity": reference,
              "int8": degraded_copy(reference, work / "int8-model", int8=True),
              "noise 0.05": degraded_copy(reference, work / "noise-small", noise=0.05),
              "noise 0.5": degraded_copy(reference, work / "noise-large", noise=0.5)}
    return {name: served_eval(model, reference, work, f"repo-{index}")
            for index, (name, model) in enumerate(copies.items())}


def test_the_checkpoint_served_agrees_with_itself(reports):
    identity = reports["identity"]
    assert identity.passed, identity.failures
    assert identity.greedy_agreement == 1.0 and identity.mean_first_divergence == TOKENS
    assert identity.logprob_mae < 1e-3


@pytest.mark.parametrize("name", ["int8", "noise 0.5"])
def test_a_degraded_engine_fails_the_gate(reports, name):
    assert not reports[name].passed
    assert reports[name].logprob_mae > Thresholds().max_logprob_mae


def test_the_figures_grade_the_degradation(reports):
    small, large = reports["noise 0.05"], reports["noise 0.5"]
    assert reports["identity"].logprob_mae < small.logprob_mae < large.logprob_mae
    assert large.mean_first_divergence <= small.mean_first_divergence <= TOKENS


def test_the_build_marks_a_failing_engine_not_ready_and_serve_refuses_it(tiny_models, tmp_path, capsys):
    import json

    from tritonforge.cli import main
    from tritonforge.tools.accuracy_gate import AccuracyGateFailed, GateOptions, run_accuracy_gate

    degraded = degraded_copy(tiny_models["bpe"], tmp_path / "degraded", noise=0.5)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(DEFAULT_PROMPTS.read_text().splitlines(keepends=True)[:4]))
    repository = tmp_path / "repo"
    build(BuildOptions(model=degraded, output=repository, max_input_len=64, max_seq_len=256))
    with pytest.raises(AccuracyGateFailed, match="not ready"):
        # As a pre-quantized checkpoint compared with its original.
        run_accuracy_gate(repository, degraded, GateOptions(accuracy_gate=prompts,
                                                            accuracy_reference=tiny_models["bpe"]), lambda _: None)
    manifest = json.loads((repository / "tritonforge.json").read_text())
    assert manifest["ready"] is False and manifest["accuracy_gate"]["passed"] is False
    assert manifest["accuracy_gate"]["greedy_agreement"] < 1.0
    assert main(["serve", str(repository)]) != 0
    assert "accuracy gate" in capsys.readouterr().err
