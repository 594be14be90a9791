"""A token id outside a GGUF's vocabulary (an output head wider than its token list, an id a
caller gives) decodes to nothing, as ``tokenizers`` does; before, llama.cpp threw
std::out_of_range through its C API and the whole server process aborted. Run in a child process
so that the old behaviour fails the test instead of killing pytest."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.real

_CHILD = """
import sys
from cloud_server.models.tokenizer import GGUFTokenizer
tok = GGUFTokenizer(sys.argv[1])
n = tok.vocab_size
ids = tok.encode("caf\\u00e9 \\U0001F600", add_special=False)
assert tok.decode([*ids[:2], n, -1, 10**9, *ids[2:]]) == tok.decode(ids) == "caf\\u00e9 \\U0001F600"
assert tok.token_bytes(n) == b"" and tok.decode([n]) == ""
print("ok", n)
"""


def test_ids_outside_the_vocabulary_decode_to_nothing(smollm2_path) -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(smollm2_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok 49152")


@pytest.fixture(scope="module")
def tokenizers(smollm2_path, tmp_path_factory):
    from cloud_server.models.export_hf import write_tokenizer
    from cloud_server.models.tokenizer import GGUFTokenizer, HFTokenizer

    folder = write_tokenizer(smollm2_path, tmp_path_factory.mktemp("hf"))
    return GGUFTokenizer(smollm2_path), HFTokenizer(folder)


def test_a_raw_prompt_with_a_lone_surrogate_is_a_request_error(tokenizers) -> None:
    """JSON can escape half an emoji ("\\ud83d") and Python keeps it: before, a completion prompt
    holding one was a UnicodeEncodeError (GGUF) or a TypeError (tokenizers), a 500; a chat
    message's text was already refused as a 400."""
    from cloud_server.exceptions import InvalidRequestError

    for tok in tokenizers:
        with pytest.raises(InvalidRequestError, match="lone UTF-16 surrogate") as err:
            tok.encode("half \ud83d an emoji")
        assert err.value.param == "prompt", type(tok)
        whole = "a whole \U0001F600 emoji, \u65e5\u672c and a NUL \x00"
        assert tok.decode(tok.encode(whole, add_special=False)) == whole, type(tok)
