"""What ``hybridllm-cloud`` says on the light install (no [server] extra): a command the user can
paste. Fast and in-process: the missing extra is simulated, nothing is installed."""

from __future__ import annotations

import importlib.abc
import sys
import tomllib
from pathlib import Path

import pytest

from hybridllm import cli

ROOT = Path(__file__).resolve().parents[2]


class _NoServerExtra(importlib.abc.MetaPathFinder):
    """Importing the cloud server fails as it does without FastAPI and pydantic."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 - the finder protocol
        if name == "cloud_server.__main__":
            raise ModuleNotFoundError("No module named 'pydantic'", name="pydantic")
        return None


def test_the_missing_server_extra_names_the_wheel_file_the_build_writes(monkeypatch, capsys) -> None:
    """Before: the hint named 'dist/hybridllm-VERSION-py3-none-any.whl[server]', a file that does not
    exist; pasted as written, pip fails."""
    monkeypatch.delitem(sys.modules, "cloud_server.__main__", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_NoServerExtra(), *sys.meta_path])
    monkeypatch.delenv("HYBRIDLLM_DEBUG", raising=False)

    assert cli.cloud_main() == 1
    err = capsys.readouterr().err
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"'dist/hybridllm-{version}-py3-none-any.whl[server]'" in err, err
    assert "pip install 'hybridllm[server]'" in err and "'pydantic'" in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("missing", ["cloud_server.__main__", "hybridllm._paths"])
def test_a_broken_install_of_our_own_modules_is_not_blamed_on_the_extra(monkeypatch, missing) -> None:
    """A module of hybridllm or cloud_server itself missing is a broken install, not a missing extra:
    it is not reported as one."""

    class _Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):  # noqa: ANN001
            if name == "cloud_server.__main__":
                raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
            return None

    monkeypatch.delitem(sys.modules, "cloud_server.__main__", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Broken(), *sys.meta_path])
    with pytest.raises(ModuleNotFoundError):
        cli.cloud_main()
