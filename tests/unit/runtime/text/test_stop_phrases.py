import random

from tritonforge.runtime.text.stop_phrases import StopPhraseFilter, truncate_at_stop


def stream(phrases, pieces):
    stop_filter = StopPhraseFilter(phrases)
    out = "".join(stop_filter.push(piece) for piece in pieces)
    return out + stop_filter.flush(), stop_filter.stopped


def test_phrase_split_across_chunks_is_never_emitted():
    assert stream(["STOP"], ["hello S", "T", "OP and more"]) == ("hello ", True)


def test_held_back_prefix_is_released_when_it_does_not_match():
    stop_filter = StopPhraseFilter(["STOP"])
    assert stop_filter.push("a ST") == "a "
    assert stop_filter.push("ART") == "START"


def test_text_held_at_the_end_is_flushed():
    assert stream(["STOP"], ["abc S"]) == ("abc S", False)


def test_phrase_that_completes_first_wins():
    assert truncate_at_stop("one two three", ["three", "two"]) == ("one ", True)
    assert stream(["a", " ab"], ["  ab"]) == ("  ", True)


def test_random_chunkings_agree_with_truncation():
    rng = random.Random(7)
    alphabet = "ab "
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        phrases = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))) for _ in range(2)]
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 5))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert stream(phrases, pieces) == truncate_at_stop(text, phrases)


def test_an_empty_phrase_stops_nothing():
    """Clients send "" for no stop phrase (NVIDIA's do): it must not end every answer before its first word."""
    assert stream(["", "STOP"], ["hello ", "STOP now"]) == ("hello ", True)
    assert stream([""], ["hello"]) == ("hello", False)
