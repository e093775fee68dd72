"""A reasoning model's thinking set apart from its answer, whole and streamed in every two pieces."""

import pytest

from tritonforge.gateway.reasoning import ReasoningReader, split_reasoning

CASES = [
    ("qwen3", "<think>plan it</think>\n\nThe answer.", "plan it", "The answer."),
    ("qwen3", "  <think>a</think>b", "a", "b"),
    ("qwen3", "No thinking here.", None, "No thinking here."),
    ("qwen3", "<thin is not a tag", None, "<thin is not a tag"),
    ("qwen3", "<think>cut short", "cut short", ""),
    ("qwen3", "<think></think>answer", "", "answer"),
    ("qwen3", "answer with </think> inside", None, "answer with </think> inside"),
    ("deepseek_r1", "plan it</think>The answer.", "plan it", "The answer."),
    ("deepseek_r1", "<think>plan it</think>The answer.", "plan it", "The answer."),
    ("deepseek_r1", "still thinking </thi", "still thinking </thi", ""),
    ("deepseek_r1", "a < b</think>c", "a < b", "c"),
]


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), CASES)
def test_whole_text_splits_into_reasoning_and_content(parser, text, reasoning, content):
    assert split_reasoning(parser, text) == (reasoning, content)


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), CASES)
def test_streamed_in_any_two_pieces_it_reads_as_whole(parser, text, reasoning, content):
    for cut in range(len(text) + 1):
        reader = ReasoningReader(parser)
        pieces = [reader.push(text[:cut]), reader.push(text[cut:]), reader.finish()]
        assert "".join(piece[0] for piece in pieces) == (reasoning or "")
        assert "".join(piece[1] for piece in pieces) == content


def test_a_piece_that_may_begin_a_tag_is_held_back():
    reader = ReasoningReader("qwen3")
    assert reader.push("<thi") == ("", "")
    assert reader.push("nk>idea</th") == ("idea", "")
    assert reader.push("ink>done") == ("", "done")


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="reasoning parser must be one of qwen3, deepseek_r1"):
        ReasoningReader("o1")
