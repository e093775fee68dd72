"""The reference pages under docs/reference/ are exactly what the code generates, and every tensor has a meaning."""

import functools

import pytest

from tritonforge.cli.reference_docs import REFERENCE_DIR, contract_tensor_names, pages
from tritonforge.facts import contract
from tritonforge.facts.tensor_meanings import MEANINGS

PAGES = ("tensors.md", "model-parameters.md", "build-flags.md", "cli.md", "openai.md")


@functools.cache
def generated() -> dict[str, str]:
    return pages()  # not at import: a tensor without a meaning fails its own test, not the collection


def test_the_generator_writes_the_pages_listed_here():
    assert sorted(generated()) == sorted(PAGES)


@pytest.mark.parametrize("name", PAGES)
def test_committed_reference_page_equals_the_generated_one(name):
    committed = REFERENCE_DIR / name
    assert committed.is_file(), f"docs/reference/{name} is missing: run python -m tritonforge.cli.reference_docs"
    assert committed.read_text() == generated()[name], (
        f"docs/reference/{name} differs from what the code generates: never edit it by hand; change the code "
        f"(contract.py, tensor_meanings.py, model_parameters.py, the settings' fields, tritonforge/cli/, "
        f"tritonforge/gateway/fields.py) and run "
        f"python -m tritonforge.cli.reference_docs")


def test_every_tensor_of_the_contract_has_a_meaning():
    missing = sorted(contract_tensor_names() - set(MEANINGS))
    assert not missing, f"tensors of contract.py without a meaning in tensor_meanings.py: {missing}"


def test_no_meaning_is_left_for_a_tensor_the_contract_no_longer_has():
    assert sorted(set(MEANINGS) - contract_tensor_names()) == []


def test_the_names_collected_include_the_wiring_specific_and_bls_only_tensors():
    names = contract_tensor_names()
    assert {contract.MESSAGES_INPUT.name, contract.MESSAGES_PREPROCESSING_INPUT.name} <= names
    assert {tensor.name for tensor in contract.BLS_EXTRA_INPUTS} <= names


def test_every_tensor_row_shows_its_meaning_on_the_tensors_page():
    page = generated()["tensors.md"]
    for name in contract_tensor_names():
        assert f"| `{name}` |" in page and MEANINGS[name].replace("|", "\\|") in page, name


def test_every_build_flag_and_cli_command_is_on_its_page():
    from tritonforge.cli import make_parser
    from tritonforge.cli.reference_docs import subcommands

    commands, _ = subcommands(make_parser())
    build_flags = {flag for action in commands["build"]._actions for flag in action.option_strings} - {"-h", "--help"}
    for flag in build_flags:
        assert f"| `{flag}` |" in generated()["build-flags.md"], flag
    for name, command in commands.items():
        assert f"## `tritonforge {name}`" in generated()["cli.md"]
        if name != "build":
            for action in command._actions:
                for flag in set(action.option_strings) - {"-h", "--help"}:
                    # serve takes the build's flags for a checkpoint: they are on the build's page
                    page = "build-flags.md" if name == "serve" and flag in build_flags else "cli.md"
                    assert f"`{flag}" in generated()[page], (name, flag)
