"""StopMatcher: the text cut at a stop string must not depend on how it was split into pieces."""

import random

import pytest

from hybridllm.backends.base import StopMatcher


def feed_all(stops, pieces):
    m = StopMatcher(tuple(stops))
    out = []
    for p in pieces:
        text, hit = m.feed(p)
        out.append(text)
        if hit:
            return "".join(out), True
    out.append(m.flush())
    return "".join(out), False


@pytest.mark.parametrize("pieces", [["xyz12"], ["xyz1", "2"], list("xyz12")])
def test_a_short_stop_that_ends_first_wins_over_a_long_one_that_starts_first(pieces):
    # "z1" is complete one character before "xyz12": a stream reading one token at a time stops
    # there, so the same text in one piece must stop there too (it cut at "xyz12" and lost "xy")
    assert feed_all(["xyz12", "z1"], pieces) == ("xy", True)


def test_two_stops_ending_together_cut_at_the_earlier_start():
    assert feed_all(["b", "ab"], ["xab"]) == ("x", True)
    assert feed_all(["b", "ab"], list("xab")) == ("x", True)


def test_a_stop_that_is_a_prefix_of_another_cuts_at_once():
    assert feed_all(["END", "ENDING"], ["go END", "ING"]) == ("go ", True)


def test_a_stop_split_inside_an_emoji_sequence_and_cjk():
    assert feed_all(["\U0001f600\u7d42"], ["a\U0001f600", "\u7d42b"]) == ("a", True)
    assert feed_all(["\U0001f600\u7d42"], ["a\U0001f600", "x"]) == ("a\U0001f600x", False)


def test_regex_metacharacters_and_whitespace_stops_are_literal():
    assert feed_all([".*"], ["a.b", ".*c"]) == ("a.b", True)
    assert feed_all(["\n\n"], ["one\n", "\ntwo"]) == ("one", True)
    assert feed_all(["\n\n"], ["one\n"]) == ("one\n", False)  # held, then released at the end


@pytest.mark.parametrize("seed", range(4))
def test_any_split_of_the_text_gives_the_same_answer(seed):
    rng = random.Random(seed)
    alphabet = "ab\n\U0001f600"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, len(text))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert feed_all(stops, pieces) == feed_all(stops, list(text)) == feed_all(stops, [text]), (
            text, stops, pieces)
