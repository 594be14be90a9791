"""A GGUF whose header lost its architecture (a flipped byte in the key ``general.architecture``
or in its value) is reported as a damaged file with the command that puts it back, not as an
architecture this llama.cpp cannot run ("unknown model architecture: ''" or 'l\ufffdama': pass a
GGUF of a supported one)."""

from __future__ import annotations

import pytest

from hybridllm import ModelCorruptError

pytestmark = pytest.mark.real


@pytest.mark.parametrize("where", ["key", "value"])
def test_a_flipped_byte_in_the_architecture_is_a_damaged_file(tmp_path, smollm2_path, where):
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    data = bytearray(smollm2_path.read_bytes())
    at = data.index(b"general.architecture", 0, 4096)
    if where == "value":  # "l\xecama": "unknown model architecture: 'l\ufffdama'"
        data[data.index(b"llama", at) + 1] ^= 0x80
    else:  # "gen\xe1ral.architecture": llama.cpp finds none, "unknown model architecture: ''"
        data[at + 3] ^= 0x80
    bad = tmp_path / smollm2_path.name  # a copy of the catalog's file, kept under its own name
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelCorruptError) as err:
        LlamaCppBackend(str(bad), n_ctx=128, n_threads=1)
    text = str(err.value)
    assert str(bad) in text and "truncated, corrupt" in text, text
    assert "hybridllm models pull smollm2-135m-instruct --force" in text, text
    assert "cannot run models of that architecture" not in text, text
