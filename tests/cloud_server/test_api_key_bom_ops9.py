"""An API key file saved with a UTF-8 BOM (Windows Notepad does): the BOM is no part of the first key.

Before, the file was read as plain UTF-8, the BOM stayed at the start of the first key, and that
key never matched (``.strip()`` does not remove U+FEFF, nor did the whitespace check catch it). The
real server with such a file is checked in ``test_request_nulls_ops9.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud_server.api.auth import ApiKeyChecker, load_api_keys
from cloud_server.exceptions import AuthError
from hybridllm.wire import auth


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_bom_is_not_part_of_the_first_key(tmp_path: Path, newline: str) -> None:
    path = tmp_path / "keys.txt"
    path.write_bytes(b"\xef\xbb\xbf" + newline.join(["sk-first", "# a comment", "sk-second", ""]).encode())
    keys = load_api_keys([], path, environ={})
    assert keys == ["sk-first", "sk-second"]
    checker = ApiKeyChecker(keys)
    checker.check("Bearer sk-first")
    with pytest.raises(AuthError):
        checker.check("Bearer \ufeffsk-first")


def test_the_proxys_loader_strips_it_too(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_bytes(b"\xef\xbb\xbfsk-only\n")
    assert auth.load_api_keys([], path, {}, env_var="UNUSED_KEYS") == ["sk-only"]


def test_a_bom_alone_is_a_file_with_no_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_bytes(b"\xef\xbb\xbf\n")
    with pytest.raises(ValueError, match="holds no key"):
        auth.load_api_keys([], path, {}, env_var="UNUSED_KEYS")
