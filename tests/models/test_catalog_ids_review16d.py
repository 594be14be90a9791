"""Catalog ids outside the store (helper-j7): the ONNX backend takes an id in any case or with
spaces around it, as the llama.cpp path does; a damaged shipped catalog.json is a clear error
that names the file and says to reinstall. Fakes only: nothing is copied, built or loaded."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest

from hybridllm import HybridLLMError, ModelNotFoundError, cli
from hybridllm.models import catalog, onnx_store, store

SMOL = "smollm2-135m-instruct"
SPELLINGS = ("SmolLM2-135M-Instruct", "  smollm2-135m-instruct\n", "SMOLLM2-135M-INSTRUCT ")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _prepared(spec) -> Path:
    """A finished ONNX folder for ``spec`` as `models prepare` leaves it (its record only)."""
    folder = onnx_store.onnx_dir(spec.id)
    folder.mkdir(parents=True)
    (folder / "genai_config.json").write_text("{}")
    (folder / onnx_store.META_FILE).write_text(json.dumps({
        "model_id": spec.id, "format_version": onnx_store.FORMAT_VERSION,
        "source_sha256": spec.main_file.sha256}))
    return folder


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_same_id_spelling_resolves_on_both_backends(home, monkeypatch, spelling):
    """Before: resolve_gguf took 'SmolLM2-135M-Instruct' (through get_spec) but resolve_onnx said
    "Unknown model 'SmolLM2-135M-Instruct': neither a catalog id (... smollm2-135m-instruct ...)"."""
    spec = catalog.get_spec(SMOL)
    fake_gguf = home / "fake.gguf"
    monkeypatch.setattr(store, "pull", lambda mid, progress=None: fake_gguf)  # no real copy
    assert store.resolve_gguf(spelling) == (SMOL, fake_gguf, spec)

    folder = _prepared(spec)
    assert onnx_store.resolve_onnx(spelling) == (SMOL, folder, spec)


def test_an_unprepared_id_in_another_case_gets_the_prepare_hint_not_unknown(home, monkeypatch):
    """Before: "Unknown model" for a catalog id; now the message of the id itself (how to prepare)."""
    monkeypatch.setattr(onnx_store, "missing_export_modules", lambda: ["torch"])
    with pytest.raises(ModelNotFoundError) as err:
        onnx_store.resolve_onnx("SmolLM2-135M-Instruct", precision="int8")
    text = str(err.value)
    assert "Unknown model" not in text
    assert f"`hybridllm models prepare {SMOL} --backend onnx --precision int8`" in text


def test_a_local_folder_still_comes_before_the_case_blind_match(home, tmp_path, monkeypatch):
    """A prepared folder named like an id in another case is that folder, not the catalog model."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "SmolLM2-135M-Instruct"
    mine.mkdir()
    (mine / "genai_config.json").write_text("{}")
    assert onnx_store.resolve_onnx("SmolLM2-135M-Instruct") == (mine.name, Path(mine.name), None)
    with pytest.raises(ModelNotFoundError, match="Unknown model 'no-such-model'"):
        onnx_store.resolve_onnx("no-such-model")


# ---- a damaged shipped catalog.json ----

REAL = Path(str(importlib.resources.files("hybridllm") / "_data" / "catalog.json"))  # before any patch


def _entries() -> dict:
    return json.loads(REAL.read_text())


def _drop(field: str):
    raw = _entries()
    del raw["models"][0][field]
    return json.dumps(raw)


def _drop_sha():
    raw = _entries()
    next(iter(raw["models"][0]["files"].values())).pop("sha256")
    return json.dumps(raw)


DAMAGED = {
    "invalid json": lambda: '{"version": 1, "models": [{"id": "x", ',
    "not utf-8": lambda: "\udcff{}",  # written as the byte 0xff
    "no models": lambda: json.dumps({"version": 1}),
    "a list": lambda: "[]",
    "no kind": lambda: _drop("kind"),
    "no id": lambda: _drop("id"),
    "no files": lambda: _drop("files"),
    "no sha256": _drop_sha,
}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """The package's data folder, redirected to a copy the test may damage."""
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    path = tmp_path / "pkg" / "_data" / "catalog.json"
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    catalog.load_catalog.cache_clear()
    yield path
    catalog.load_catalog.cache_clear()


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_catalog_is_a_clear_error_naming_the_file(shipped, home, capsys, damage):
    """Before: a raw JSONDecodeError / KeyError / TypeError traceback from any command."""
    shipped.write_bytes(DAMAGED[damage]().encode("utf-8", "surrogateescape"))
    with pytest.raises(HybridLLMError) as err:
        catalog.load_catalog()
    message = str(err.value)
    assert str(shipped) in message and "Reinstall hybridllm" in message, message
    assert cli.main(["models", "list"]) == 1
    out = capsys.readouterr().err
    assert out.startswith("error: This hybridllm install is damaged") and str(shipped) in out, out
    assert "Traceback" not in out and "internal error" not in out

    # the failure is not cached: the file put back is read again
    shipped.write_text(json.dumps(_entries()))
    assert SMOL in catalog.load_catalog()


def test_a_whole_catalog_still_loads_with_its_extra_fields(shipped):
    shipped.write_text(json.dumps(_entries()))
    spec = catalog.get_spec(SMOL)
    assert spec.kind == "gguf" and spec.files and "context_length" in spec.extra
