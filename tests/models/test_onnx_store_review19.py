"""The ONNX folder's record (hybridllm.json) and the build around it (helper-r6, review 19).

A record that is JSON but not an object is damaged, as one that is not JSON is (before: read as
an empty record, silently); the record and the build's files are read as UTF-8 whatever the
locale (before: a non-ASCII template or path failed under LC_ALL=C or a Windows code page); a
builder log line that is not UTF-8 no longer ends the build with a raw UnicodeDecodeError; a full
disk leaves no half folder. The heavy build steps are quick stand-ins (as in
test_onnx_prepare_review16.py); the record, the lock, the swap and the builder's subprocess
handling are the real code.
"""

from __future__ import annotations

import errno
import json
import pathlib
import sys
import types
from pathlib import Path

import pytest

from hybridllm import ModelCorruptError
from hybridllm.models import onnx_store

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the build lock is fcntl's")

MODEL = "smollm2-135m-instruct"
TEMPLATE = "{{ messages[0]['content'] }} \u2192 Z\u00fcrich"


@pytest.fixture
def ascii_locale(monkeypatch):
    """Path.read_text/write_text without an encoding use ASCII, as under LC_ALL=C with Python's
    UTF-8 mode off (a cp1252 Windows console garbles instead of failing)."""
    real_read, real_write = pathlib.Path.read_text, pathlib.Path.write_text

    def read_text(self, encoding=None, errors=None):
        return real_read(self, encoding=encoding or "ascii", errors=errors)

    def write_text(self, data, encoding=None, errors=None, newline=None):
        return real_write(self, data, encoding=encoding or "ascii", errors=errors, newline=newline)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    monkeypatch.setattr(pathlib.Path, "write_text", write_text)


@pytest.mark.parametrize("record", ["[1, 2]", '"prepared"', "42", "null"])
def test_a_record_that_is_not_an_object_is_damaged(tmp_path, record):
    (tmp_path / "genai_config.json").write_text("{}")
    (tmp_path / onnx_store.META_FILE).write_text(record)
    with pytest.raises(ModelCorruptError, match=r"hybridllm\.json must hold a JSON object.*prepare"):
        onnx_store.read_meta(tmp_path)
    # a prepared folder passed as the model: before, its damaged record was silently no record
    with pytest.raises(ModelCorruptError, match="hybridllm.json"):
        onnx_store.resolve_onnx(str(tmp_path))


def test_a_record_that_is_not_json_is_damaged_as_before(tmp_path):
    (tmp_path / onnx_store.META_FILE).write_text("{")
    with pytest.raises(ModelCorruptError, match="unreadable"):
        onnx_store.read_meta(tmp_path)


def test_a_folder_without_a_record_still_has_an_empty_one(tmp_path):
    assert onnx_store.read_meta(tmp_path) == {}


def test_a_record_with_non_ascii_text_reads_whatever_the_locale(tmp_path, ascii_locale):
    record = {"model_id": MODEL, "chat_template": TEMPLATE, "system_prompt": "Sei gentile, \u00e8 tutto"}
    (tmp_path / onnx_store.META_FILE).write_bytes(json.dumps(record, ensure_ascii=False).encode("utf-8"))
    assert onnx_store.read_meta(tmp_path) == record


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    import cloud_server.models.export_hf as export_hf
    from hybridllm.models import onnx_gguf, onnx_prepare

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", types.SimpleNamespace(__version__="0.test"))

    def fake_hf(gguf, out):
        out.mkdir(parents=True)
        (out / "config.json").write_bytes(b'{"num_hidden_layers": 1, "_name": "mod\xc3\xa8le"}')
        config = {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}
        (out / "tokenizer_config.json").write_bytes(json.dumps(config, ensure_ascii=False).encode("utf-8"))
        return out

    def fake_builder(cmd, log, num_matmuls, progress, span):
        out = Path(cmd[cmd.index("-o") + 1])
        out.mkdir(parents=True)
        (out / "genai_config.json").write_bytes(b'{"model": {}}')
        (out / "model.onnx").write_bytes(b"new")

    monkeypatch.setattr(export_hf, "gguf_to_hf_folder", fake_hf)
    monkeypatch.setattr(onnx_prepare, "_run_builder", fake_builder)
    monkeypatch.setattr(onnx_prepare, "missing_export_modules", lambda: [])
    monkeypatch.setattr(onnx_prepare, "pull", lambda model_id: Path("unused.gguf"))
    monkeypatch.setattr(onnx_gguf, "rewrite", lambda model, gguf: {})
    return tmp_path / "home" / "models" / MODEL / "onnx-int4-cpu"


def test_a_build_with_non_ascii_files_works_whatever_the_locale(fake_build, ascii_locale):
    """Before: the exporter's tokenizer_config.json (a template with non-ASCII text, as Qwen's
    and many others' hold) failed to decode, and the build ended with a raw UnicodeDecodeError."""
    from hybridllm.models import onnx_prepare

    final = onnx_prepare.prepare_onnx(MODEL)
    assert final == fake_build
    assert onnx_store.read_meta(final)["chat_template"] == TEMPLATE
    assert onnx_store.is_prepared(final, onnx_store.get_spec(MODEL))


def test_a_builder_log_that_is_not_utf8_still_reports_the_failure(tmp_path):
    """Before: one undecodable byte in the builder's output (a path, a warning in the console's
    code page) ended the build with UnicodeDecodeError instead of the builder's own error."""
    from hybridllm.models import onnx_prepare

    child = ("import sys; sys.stdout.buffer.write(b'reading /m/mod\\xe8le\\n'); "
             "sys.stdout.buffer.write(b'ValueError: the real reason\\n'); sys.exit(3)")
    with pytest.raises(onnx_prepare.PrepareError, match=r"exit 3\).*the real reason") as err:
        onnx_prepare._run_builder([sys.executable, "-c", child], tmp_path / "log", 1, None, (25, 90))
    assert "mod\ufffdle" in str(err.value)


def test_a_full_disk_leaves_no_half_folder_and_says_so_in_one_line(fake_build, monkeypatch, capsys):
    """The record is the build's last write: a disk that fills there leaves neither the new folder
    nor its work folder, and the CLI says what happened in one line (no 'internal error')."""
    from hybridllm import cli

    real_write = pathlib.Path.write_text

    def full(self, *args, **kwargs):
        if self.name == onnx_store.META_FILE:
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    code = cli.main(["models", "prepare", MODEL, "--backend", "onnx"])
    err = capsys.readouterr().err
    assert code == 1
    assert "No space left on device" in err and "internal error" not in err
    assert not fake_build.exists()
    assert [p.name for p in fake_build.parent.iterdir() if p.name.startswith(".onnx-")] == []


def test_a_damaged_record_of_a_catalog_model_names_the_command(fake_build):
    """Where it cannot be built again here (prepare=False, or no [export] extra): the message
    says which command does it (before: only "prepare the model again")."""
    fake_build.mkdir(parents=True)
    (fake_build / "genai_config.json").write_text("{}")
    (fake_build / onnx_store.META_FILE).write_text("[]")
    with pytest.raises(ModelCorruptError, match=r"JSON object.*`hybridllm models prepare "
                       rf"{MODEL} --backend onnx --force`"):
        onnx_store.resolve_onnx(MODEL, prepare=False)
