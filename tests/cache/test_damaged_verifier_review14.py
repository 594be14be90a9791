"""A verifier file given by path that is truncated or has a damaged member is a ConfigError that
names it, not a zipfile.BadZipFile traceback ("internal error" at the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hybridllm
from hybridllm._exceptions import ConfigError
from hybridllm.cache.semantic import load_verifier

SHIPPED = Path(hybridllm.__file__).parent / "_data" / "cache_verifier.npz"


@pytest.mark.parametrize("damage", ["truncated", "member"])
def test_a_damaged_verifier_file_is_a_config_error(tmp_path: Path, damage: str) -> None:
    data = bytearray(SHIPPED.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:  # zeros inside a member: its CRC fails when it is read
        at = len(data) // 3
        data[at:at + 64] = bytes(64)
    bad = tmp_path / "verifier.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="verifier.npz"):
        load_verifier(bad)


def test_the_shipped_file_by_path_still_loads() -> None:
    assert load_verifier(SHIPPED) is not None
