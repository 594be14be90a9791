"""A prepared ONNX folder's own numbers and the huge-page scan (helper-r6, review 19), on a fake
ONNX Runtime GenAI: no model is loaded. A context_length that is not a whole number of tokens is
a ModelCorruptError naming the file, the field and the re-prepare command (before: a raw
ValueError from int(), or a negative length taken); /proc/self/smaps is read whatever the
locale (before: a mapped file's non-ASCII path silently switched huge pages off)."""

from __future__ import annotations

import builtins
import json

import pytest

from hybridllm import ModelCorruptError
from hybridllm.backends import onnx_memory

from .test_onnx_review18 import folder  # noqa: F401  (the fixture: a folder on a fake runtime)


def _backend(folder, **kw):  # noqa: F811
    from hybridllm.backends.onnx import OnnxBackend

    return OnnxBackend(str(folder), huge_pages=False, chat_format="completion", **kw)


def _context(folder, value):  # noqa: F811
    (folder / "genai_config.json").write_text(json.dumps(
        {"model": {"context_length": value, "bos_token_id": 1, "eos_token_id": [2]}}))


@pytest.mark.parametrize("value", ["2k", "", -1, -4096, True, 2048.5, [2048], {"n": 1}])
@pytest.mark.parametrize("n_ctx", [0, 32])
def test_a_context_length_that_is_no_token_count_is_a_corrupt_folder(folder, value, n_ctx):  # noqa: F811
    _context(folder, value)
    with pytest.raises(ModelCorruptError) as err:
        _backend(folder, n_ctx=n_ctx)
    text = str(err.value)
    assert "genai_config.json" in text and "context_length" in text
    assert repr(value) in text
    assert "Prepare it again" in text


@pytest.mark.parametrize(("value", "n_ctx", "expected"), [
    (64, 0, 64), (64, 32, 32), (64, 128, 64), (64.0, 0, 64), (None, 32, 32), (0, 32, 32)])
def test_a_whole_context_length_is_taken_as_before(folder, value, n_ctx, expected):  # noqa: F811
    _context(folder, value)
    assert _backend(folder, n_ctx=n_ctx).context_length == expected


SMAPS = """\
7f0000000000-7f0000400000 r--s 00000000 08:01 123 /home/jos\u00e9/mod\u00e8le/model.onnx.data
Rss:                4096 kB
VmFlags: rd sh mr mw me ms sd
7f0000400000-7f0000800000 rw-p 00000000 00:00 0
Rss:                2048 kB
VmFlags: rd wr mr mw me ac sd
"""


def test_smaps_is_read_whatever_the_locale(tmp_path, monkeypatch):
    """A mapped model file under a non-ASCII path (a home folder 'josé'), read in the C locale's
    ASCII: before, the decode error made the scan return nothing, and no memory was advised."""
    fake = tmp_path / "smaps"
    fake.write_bytes(SMAPS.encode("utf-8"))
    real_open = builtins.open

    def locale_open(file, mode="r", *args, encoding=None, **kw):
        if file == "/proc/self/smaps":
            file = fake
        if "b" not in mode and encoding is None:
            encoding = "ascii"  # what open() takes from LC_ALL=C with Python's UTF-8 mode off
        return real_open(file, mode, *args, encoding=encoding, **kw)

    monkeypatch.setattr(builtins, "open", locale_open)
    assert onnx_memory._anon_regions() == {(0x7F0000400000, 0x7F0000800000): (2048 * 1024, False)}
