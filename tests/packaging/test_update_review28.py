"""Updating an installed wheel after pulling new code, as the README's first-run section says.

The version stays 0.1.0 from commit to commit, so ``pip install dist/hybridllm-0.1.0-...whl`` over
an installed 0.1.0 changes nothing ("already installed with the same version"): a user who followed
the install steps again kept the old code. The README now gives the commands that replace it."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "# built for test_update_review28"


def _wheel_name() -> str:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"dist/hybridllm-{version}-py3-none-any.whl"


def _update_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Installation and first run\n")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = [b.split("```", 1)[0] for b in section.split("```bash\n")[1:]]
    (block,) = [b for b in blocks if "--force-reinstall" in b]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_the_readme_says_how_to_update_an_installed_wheel() -> None:
    assert _update_block() == [
        "rm -rf build",
        "pip wheel --no-deps -w dist .",
        f"pip install --force-reinstall --no-deps {_wheel_name()}",
        f"pip install {_wheel_name()}",
    ]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def _step(line: str, checkout: Path, venv: Path) -> None:
    """One README line, as written, in ``checkout``: builds with this interpreter (no build
    isolation, so nothing is fetched), installs into ``venv``."""
    words = shlex.split(line)
    if words[:2] == ["pip", "wheel"]:
        _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "-q", *words[2:]], cwd=checkout)
    elif words[:2] == ["pip", "install"]:
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *words[2:]], cwd=checkout)
    else:
        _run(["sh", "-c", line], cwd=checkout)


@pytest.mark.real
def test_the_readme_update_steps_replace_the_installed_code(tmp_path: Path) -> None:
    """Slow (two wheel builds and a venv, no model). A checkout is built and installed as the install
    steps say; then new code comes in (a module removed, another changed) and the README's update
    steps run, as written, in the same checkout. The last step (dependencies) is left out: it
    fetches the light install's packages, and only the installed code is checked here."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "tests", "notebooks", "bench"))
    gone = checkout / "hybridllm" / "_gone_review28.py"
    gone.write_text("REMOVED_IN_THE_NEW_CODE = True\n")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    _step("pip wheel --no-deps -w dist .", checkout, venv)  # the install steps, without dependencies
    _step(f"pip install --no-deps {_wheel_name()}", checkout, venv)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    assert (site / "hybridllm" / "_gone_review28.py").is_file()

    gone.unlink()  # the new code
    with (checkout / "hybridllm" / "__init__.py").open("a") as f:
        f.write(f"\n{MARKER}\n")
    _step("pip wheel --no-deps -w dist .", checkout, venv)
    _step(f"pip install --no-deps {_wheel_name()}", checkout, venv)  # the install steps again
    init = site / "hybridllm" / "__init__.py"
    assert MARKER not in init.read_text(), "pip replaced a wheel of the same version"

    for line in _update_block()[:-1]:
        _step(line, checkout, venv)
    assert MARKER in init.read_text()
    assert not (site / "hybridllm" / "_gone_review28.py").exists(), "the old build's module is installed"
