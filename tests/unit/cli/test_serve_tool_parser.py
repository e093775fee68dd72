"""`serve --openai-port` reads tool calls in the format the repository's chat template writes, unless told."""

import json

import pytest

from tritonforge.cli.serve import tool_parser_of


@pytest.fixture
def repository(tmp_path):
    (tmp_path / "preprocessing" / "tokenizer").mkdir(parents=True)
    return tmp_path


def test_a_template_file_beside_the_tokenizer_names_its_format(repository):
    (repository / "preprocessing" / "tokenizer" / "chat_template.jinja").write_text("{{ '[TOOL_CALLS]' }}")
    assert tool_parser_of(repository) == "mistral"


def test_named_templates_in_the_tokenizer_config_are_all_read(repository):
    templates = [{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "<|python_tag|>"}]
    (repository / "preprocessing" / "tokenizer" / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": templates}))
    assert tool_parser_of(repository) == "llama3_json"


def test_without_a_template_or_markers_hermes_is_read(repository):
    assert tool_parser_of(repository) == "hermes"
    (repository / "preprocessing" / "tokenizer" / "tokenizer_config.json").write_text("{not json")
    assert tool_parser_of(repository) == "hermes"
