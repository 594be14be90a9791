"""``hybridllm-cloud`` on an install that has the [proxy] extra but not [server]: FastAPI and
pydantic are there, so the command's own modules import, and torch, gguf, prometheus_client and
jinja2 are not. Fast and in-process: the missing modules are simulated, nothing is served."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

import cloud_server.__main__ as cloud_module
from hybridllm import cli

ROOT = Path(__file__).resolve().parents[2]
# what `pip install 'hybridllm[proxy]'` leaves out of the [server] extra's modules
NOT_IN_PROXY = ("torch", "gguf", "prometheus_client", "jinja2")


@pytest.mark.parametrize("missing", [NOT_IN_PROXY, ("prometheus_client",), ("jinja2",)])
def test_the_cloud_command_on_the_proxy_extra_says_what_to_install(monkeypatch, capsys, missing) -> None:
    """Before: `hybridllm-cloud serve --model ...` with [proxy] installed went past the import check
    and ended in a traceback (ModuleNotFoundError: No module named 'prometheus_client')."""
    for name in missing:  # None in sys.modules: find_spec finds nothing and an import fails
        monkeypatch.setitem(sys.modules, name, None)
    served = []
    monkeypatch.setattr(cloud_module, "serve", lambda args: served.append(args) or 0)
    monkeypatch.setattr(sys, "argv", ["hybridllm-cloud", "serve", "--model", "smollm2-135m-instruct"])
    monkeypatch.delenv("HYBRIDLLM_DEBUG", raising=False)

    assert cli.cloud_main() == 1
    err = capsys.readouterr().err
    assert served == [], "the server was started without its extra"
    assert err.startswith("hybridllm-cloud: error: the cloud server needs the [server] extra"), err
    assert f"lacks {missing[0]!r}" in err and "pip install 'hybridllm[server]'" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_the_modules_checked_are_the_server_extras_own() -> None:
    """The check is only as good as its list: every package of the [server] extra, by import name."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = (re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0] for req in extras["server"])
    wanted = {name.lower().replace("-", "_") for name in names}
    assert set(cli.SERVER_MODULES) == wanted
