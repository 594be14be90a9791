from hybridllm.backends.llama_cpp import StopMatcher


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


def test_stop_split_across_pieces_is_cut_and_never_leaks():
    assert feed_all(["END"], ["hello E", "N", "D more"]) == ("hello ", True)


def test_partial_match_that_fails_is_released():
    assert feed_all(["END"], ["hello E", "NX"]) == ("hello ENX", False)


def test_held_text_is_flushed_at_the_end():
    assert feed_all(["END"], ["abc", "EN"]) == ("abcEN", False)


def test_earliest_of_several_stops_wins():
    assert feed_all(["b", "zz"], ["a zz b"]) == ("a ", True)


def test_no_stops_passes_through():
    assert feed_all([], ["a", "b"]) == ("ab", False)
