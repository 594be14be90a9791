"""A catalog.json whose sizes or counts are not whole numbers in range is refused (review 30).

Before: the loader took a file size of NaN, 1e999 (Python's json reads it as inf), -5, "12" or
true, and the same for context_length, dimensions and a parts source's count, so a broken
number reached the store's size check, ``range()`` or ``models list``. Now the load fails as
for any other malformed entry: one error naming the file, the entry's id and the field."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest

from hybridllm import HybridLLMError, cli
from hybridllm.models import catalog

REAL = Path(str(importlib.resources.files("hybridllm") / "_data" / "catalog.json"))
BAD = {"NaN": "NaN", "1e999": "1e999", "-5": "-5", '"12"': '"12"', "true": "true", "2.5": "2.5"}


def _entry(mid: str, **fields: object) -> dict:
    entry = {"id": mid, "kind": "gguf", "description": "d", "package": "p", "package_version": "1",
             "pip": "pip install p", "source": {"type": "file", "path": "p/a.gguf"},
             "license": "mit", "architecture": "llama", "chat_format": None,
             "files": {"a.gguf": {"sha256": "00", "size": 7}}}
    entry.update(fields)
    return entry


def _catalog_text(bad_entry: dict, where: str, literal: str) -> str:
    """Two entries, the second with the literal JSON token ``literal`` put at ``where``."""
    text = json.dumps({"version": 1, "models": [_entry("good-one"), bad_entry]})
    return text.replace(f'"{where}": "@@"', f'"{where}": {literal}')


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    path = tmp_path / "catalog.json"
    monkeypatch.setattr(catalog, "assets_dir", lambda: tmp_path)
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    catalog.load_catalog.cache_clear()
    yield path
    catalog.load_catalog.cache_clear()  # the shipped catalog again for the other tests


def _refused(shipped: Path, capsys, field: str) -> str:
    with pytest.raises(HybridLLMError) as err:
        catalog.load_catalog()
    message = str(err.value)
    assert str(shipped) in message, message
    assert "'bad-one'" in message and field in message, message
    assert cli.main(["models", "list", "--json"]) == 1
    out, errors = capsys.readouterr()
    assert out == "" and errors.startswith("error: This hybridllm install is damaged"), errors
    assert "'bad-one'" in errors and "Traceback" not in errors
    return message


@pytest.mark.parametrize("literal", sorted(BAD))
def test_a_file_size_that_is_not_a_whole_byte_count_is_refused(shipped, capsys, literal):
    entry = _entry("bad-one", files={"a.gguf": {"sha256": "00", "size": "@@"}})
    shipped.write_text(_catalog_text(entry, "size", BAD[literal]), encoding="utf-8")
    message = _refused(shipped, capsys, "files['a.gguf'].size")
    assert f"size = {literal}" in message.replace("Infinity", "1e999"), message


@pytest.mark.parametrize("field", ["context_length", "dimensions"])
@pytest.mark.parametrize("literal", sorted(BAD) + ["0"])
def test_a_count_field_that_is_not_a_positive_whole_number_is_refused(shipped, capsys, field,
                                                                      literal):
    shipped.write_text(_catalog_text(_entry("bad-one", **{field: "@@"}), field,
                                     BAD.get(literal, literal)), encoding="utf-8")
    _refused(shipped, capsys, field)


@pytest.mark.parametrize("literal", sorted(BAD) + ["0"])
def test_a_parts_source_count_that_is_not_a_positive_whole_number_is_refused(shipped, capsys,
                                                                             literal):
    source = {"type": "parts", "package": "p{i}", "path": "p{i}/part{i:02d}.bin", "count": "@@"}
    shipped.write_text(_catalog_text(_entry("bad-one", source=source), "count",
                                     BAD.get(literal, literal)), encoding="utf-8")
    _refused(shipped, capsys, "source.count")


@pytest.mark.parametrize("literal", ["NaN", "1e999", "-1e999"])
def test_any_other_number_that_is_not_finite_is_refused(shipped, capsys, literal):
    """(A negative one is taken since review 31: only sizes and counts must not be below 0.)"""
    shipped.write_text(_catalog_text(_entry("bad-one", extra={"score": "@@"}), "score", literal),
                       encoding="utf-8")
    _refused(shipped, capsys, "extra.score")


def test_sound_numbers_still_load(shipped):
    good = _entry("bad-one", context_length=8192, dimensions=384, score=0.5,
                  files={"a.gguf": {"sha256": "00", "size": 0}, "b.bin": {"sha256": "11"},
                         "c.bin": {"sha256": "22", "size": None}})
    shipped.write_text(json.dumps({"version": 1, "models": [_entry("good-one"), good]}))
    spec = catalog.get_spec("bad-one")
    assert [f.size for f in spec.files] == [0, None, None]
    assert spec.total_size is None and catalog.get_spec("good-one").total_size == 7
    assert spec.extra["context_length"] == 8192 and spec.extra["score"] == 0.5


def test_the_shipped_catalog_passes_the_check():
    catalog.load_catalog.cache_clear()
    raw = json.loads(REAL.read_text(encoding="utf-8"))
    for entry in raw["models"]:
        catalog._check_numbers(entry)  # raises on a bad number
    assert set(catalog.load_catalog()) == {e["id"] for e in raw["models"]}
