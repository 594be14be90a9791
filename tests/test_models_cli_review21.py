"""`hybridllm models` as a script and a user meet it: `verify`'s exit status (a model never pulled,
one pulled half way, one damaged), a typo in an id, and a second pull of a model that another
process is pulling. A stand-in catalog of tiny files in an empty HYBRIDLLM_HOME: nothing real is
pulled or hashed."""

from __future__ import annotations

import hashlib
import importlib
import importlib.resources
import io
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm._exceptions import ModelNotFoundError
from hybridllm._locks import HAVE_LOCKS, lock_exclusive
from hybridllm.models import _sources, catalog, store

remove_mod = importlib.import_module("hybridllm.models.remove")  # the package's `remove` is the function

ONE = "one-file-review21"
TWO = "two-files-review21"
FILES = {ONE: {"one.bin": b"1" * 3000}, TWO: {"a.bin": b"a" * 2000, "b.bin": b"b" * 4000}}


def _entry(mid: str, files: dict[str, bytes]) -> dict:
    return {
        "id": mid, "kind": "embedding", "description": "stand-in", "package": "no-such-package-21",
        "package_version": "1.0", "pip": "pip install no-such-package-21==1.0",
        "source": {"type": "dir", "path": mid},
        "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()},
        "license": "MIT", "architecture": "bert", "chat_format": None,
    }


@pytest.fixture
def home(tmp_path, monkeypatch) -> Iterator[Path]:
    """An empty data dir, a catalog of the two stand-ins, their "package" files in tmp_path/wheel."""
    home = tmp_path / "home"
    monkeypatch.setenv("HYBRIDLLM_HOME", str(home))
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    models = [_entry(mid, files) for mid, files in FILES.items()]
    (tmp_path / "pkg" / "_data" / "catalog.json").write_text(json.dumps({"version": 1, "models": models}))
    for mid, files in FILES.items():
        for name, data in files.items():
            (tmp_path / "wheel" / mid).mkdir(parents=True, exist_ok=True)
            (tmp_path / "wheel" / mid / name).write_bytes(data)
    catalog.load_catalog.cache_clear()
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    monkeypatch.setattr(_sources, "_package_root", lambda spec: tmp_path / "wheel")
    yield home
    catalog.load_catalog.cache_clear()


def _verify(capsys, *ids: str) -> tuple[int, str]:
    code = cli.main(["models", "verify", *ids])
    return code, capsys.readouterr().out


# --- verify's exit status: a named model must be there and intact; all: what is on disk ---------

def test_verify_of_a_named_model_never_pulled_fails(home, capsys):
    """Before: "missing ... not pulled" and exit 0, so `hybridllm models verify ID && run` went on
    without its model."""
    code, out = _verify(capsys, ONE)
    assert code == 1
    assert out.split()[:2] == [ONE, "missing"]


def test_verify_of_a_named_model_pulled_is_0(home, capsys):
    store.pull(ONE)
    code, out = _verify(capsys, ONE)
    assert (code, out.split()[:2]) == (0, [ONE, "ok"])


def test_verify_of_a_named_damaged_model_fails(home, capsys):
    path = store.pull(ONE) / "one.bin"
    path.write_bytes(b"2" * 3000)
    code, out = _verify(capsys, ONE)
    assert (code, out.split()[:2]) == (1, [ONE, "corrupt"])


def test_verify_of_every_model_ignores_those_never_pulled(home, capsys):
    """As `sha256sum -c --ignore-missing`: a catalog model never pulled is no failure of the check
    of what is on disk (a fresh install verifies with exit 0)."""
    assert _verify(capsys)[0] == 0
    store.pull(ONE)
    code, out = _verify(capsys)
    assert code == 0
    assert {line.split()[0]: line.split()[1] for line in out.splitlines()} == {ONE: "ok", TWO: "missing"}


def _pulled_half_way(home: Path) -> None:
    store.pull(TWO)
    (home / "models" / TWO / "b.bin").unlink()  # what a pull cut short by Ctrl-C leaves


def test_a_model_pulled_half_way_is_incomplete_not_never_pulled(home, capsys):
    """Before: "missing  not pulled" for a model with some of its files there, and `models verify`
    of every model exited 0."""
    _pulled_half_way(home)
    [result] = store.verify(TWO)
    assert result.status == "incomplete"
    assert "1 of 2 files missing (b.bin" in result.detail and f"models pull {TWO}`" in result.detail
    code, out = _verify(capsys)
    assert code == 1 and f"{TWO}  incomplete  1 of 2 files missing" in out, out
    assert _verify(capsys, TWO)[0] == 1


def test_pull_after_a_pull_cut_short_makes_it_whole(home, capsys):
    _pulled_half_way(home)
    assert cli.main(["models", "pull", TWO]) == 0
    assert _verify(capsys, TWO)[0] == 0


def test_verify_of_every_model_fails_on_a_damaged_one(home, capsys):
    (store.pull(ONE) / "one.bin").write_bytes(b"x")
    assert _verify(capsys)[0] == 1


# --- a typo in an id: the close catalog id is named -------------------------------------------

@pytest.mark.parametrize(("typed", "meant"), [
    ("smolm2-135m-instruct", "'smollm2-135m-instruct'"),  # a letter left out
    ("smollm2", "'smollm2-135m-instruct'"),  # the start of an id
    ("qwen2.5-coder", "'qwen2.5-coder-0.5b-instruct' or 'qwen2.5-coder-1.5b-instruct'"),
    ("gemma-270m", "'gemma3-270m'"),
])
def test_a_typo_names_the_close_id(typed, meant, capsys):
    """Before: only the list of every id; now the close one too, on every command and in Python."""
    with pytest.raises(ModelNotFoundError, match=f"Did you mean {meant}\\?$"):
        catalog.get_spec(typed)
    with pytest.raises(ModelNotFoundError, match=f"Did you mean {meant}\\?$"):
        remove_mod.spec_of(typed)
    assert cli.main(["models", "pull", typed]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: Unknown model '{typed}'") and err.endswith(f"Did you mean {meant}?\n")


@pytest.mark.parametrize("typed", ["zzz-no-such-thing", "", "   "])
def test_an_id_near_none_suggests_nothing(typed):
    with pytest.raises(ModelNotFoundError) as info:
        catalog.get_spec(typed)
    assert "Did you mean" not in str(info.value)


# --- a second pull while another process holds the model's folder ------------------------------

@pytest.mark.skipif(not HAVE_LOCKS, reason="no file locks here")
def test_a_pull_that_waits_for_another_says_so(home, monkeypatch):
    """Before: the second `models pull` sat silent until the first was done (a minute for the 1.1 GB
    model), as if it hung; now a line on stderr says what it waits for."""
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    folder = home / "models" / ONE
    folder.mkdir(parents=True)
    fd = os.open(folder, os.O_RDONLY)  # the lock another pull holds (flock: per open file)
    codes: list[int] = []
    try:
        assert lock_exclusive(fd)
        worker = threading.Thread(target=lambda: codes.append(cli.main(["models", "pull", ONE])))
        worker.start()
        deadline = time.monotonic() + 10
        while "waiting" not in err.getvalue() and time.monotonic() < deadline and worker.is_alive():
            time.sleep(0.01)
        assert codes == [] and worker.is_alive()  # still waiting, and said so
        assert f"waiting for a pull, prepare or remove of {ONE} in another process" in err.getvalue()
    finally:
        os.close(fd)  # releases the lock: the waiting pull goes on
    worker.join(10)
    assert codes == [0] and store.pull_state(ONE) == store.PULLED
