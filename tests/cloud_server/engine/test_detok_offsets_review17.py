"""Byte-level tokens (one byte each): the detokenizer's stream and the logprobs' text offsets
around characters split across tokens and bytes that are no character (no model)."""

from __future__ import annotations

from cloud_server.engine.detokenizer import IncrementalDetokenizer
from cloud_server.engine.logprobs import TokenLogprob, release, text_offset


def lossy(ids: list[int]) -> str:  # as ``tokenizers`` and the llama.cpp tokenizer decode
    return bytes(ids).decode("utf-8", errors="replace")


def per_byte(ids: list[int]) -> str:  # byte-fallback decoders: one U+FFFD per bad byte
    data = bytes(ids)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        head = data[: e.start].decode("utf-8")
        return head + "\ufffd" + per_byte(list(data[e.start + 1 :]))


def test_split_characters_stream_without_u_fffd_and_join_to_the_one_shot_text():
    text = "né€😀 ok é"
    ids = list(text.encode())
    for stop in ([], ["zz"], ["😀 o"]):
        d = IncrementalDetokenizer(lossy, stop)
        sent = [d.update(ids[: i + 1], final=i + 1 == len(ids)) for i in range(len(ids))]
        assert not any("\ufffd" in s for s in sent)
        want = text[: text.find(stop[0])] if stop and stop[0] in text else text
        assert "".join(sent) == d.text == want


def test_offsets_point_into_the_text_for_split_characters_and_stray_bytes():
    for decode in (lossy, per_byte):
        ids = list("a€b".encode())  # € is 3 tokens: each starts where € does
        assert [text_offset(decode, ids, i) for i in range(len(ids))] == [0, 1, 1, 1, 2]
        # a stray byte (0xff) is U+FFFD in the text: the token after it starts one later
        ids = [0xFF, 0x61, 0xE2, 0x82, 0xAC, 0x62]
        assert decode(ids) == "\ufffda€b"
        assert [text_offset(decode, ids, i) for i in range(len(ids))] == [0, 1, 2, 2, 2, 3]
        ids = [0xE2, 0x82, 0x61]  # a character broken off: its U+FFFD stays, "a" after it
        assert text_offset(decode, ids, 2) == len(decode(ids)) - 1


def test_the_entry_after_a_stray_byte_waits_for_its_own_text():
    ids = [0x61, 0xFF, 0x62]  # "a\ufffdb"
    d = IncrementalDetokenizer(lossy, [])
    pending = [TokenLogprob(t, 0.0) for t in ids]
    for i, e in enumerate(pending):
        e.text_offset = text_offset(lossy, ids, i)
    d.update(ids[:2])  # "a" sent, the U+FFFD held (it may be an incomplete character)
    assert [e.token_id for e in release(pending, d.num_sent_chars, final=False, cut=False)] == [0x61]
    d.update(ids)  # "\ufffdb" sent
    assert [e.token_id for e in release(pending, d.num_sent_chars, final=False, cut=False)] == [0xFF, 0x62]
