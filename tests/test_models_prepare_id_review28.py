"""`hybridllm models prepare` options (review 28): the ONNX build got the id as typed (its bar read
"Preparing  SmolLM2-135M-Instruct "), and options it would not use were dropped without a word:
`--precision int8` without --backend onnx pulled the GGUF, --force on a GGUF model did not copy it
again, and on the embedder rebuilt nothing."""

from __future__ import annotations

import pytest

from hybridllm import cli
from hybridllm.models import onnx_prepare, store


@pytest.fixture
def seen(monkeypatch, tmp_path) -> list:
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path))
    calls: list = []

    def prepare(model_id, *, precision, force):
        calls.append(("onnx", model_id, precision, force))
        return 0

    def pull(model_id, *, progress=None, force=False, on_wait=None):
        calls.append(("pull", model_id, force))
        return tmp_path / "m.gguf"
    monkeypatch.setattr(onnx_prepare, "cli_prepare", prepare)
    monkeypatch.setattr(store, "pull", pull)
    return calls


def test_onnx_prepare_is_given_the_catalog_id(seen):
    assert cli.main(["models", "prepare", " SmolLM2-135M-Instruct ", "--backend", "onnx"]) == 0
    assert cli.main(["models", "prepare", "smollm2-135m-instruct", "--backend", "onnx",
                     "--precision", "int8", "--force"]) == 0
    assert seen == [("onnx", "smollm2-135m-instruct", "int4", False),
                    ("onnx", "smollm2-135m-instruct", "int8", True)]


def test_force_on_a_gguf_model_copies_it_again(seen, capsys):
    assert cli.main(["models", "prepare", "smollm2-135m-instruct", "--force"]) == 0
    assert seen == [("pull", "smollm2-135m-instruct", True)]


@pytest.mark.parametrize("argv, said", [
    (["smollm2-135m-instruct", "--precision", "int8"], "picks the ONNX weights: add --backend onnx"),
    (["minilm-l6-v2", "--precision", "fp32"], "--precision picks the ONNX weights"),
    (["minilm-l6-v2", "--force"], "--force does not rebuild minilm-l6-v2's export"),
])
def test_an_option_prepare_would_not_use_is_a_usage_error(seen, capsys, argv, said):
    assert cli.main(["models", "prepare", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert seen == []  # nothing pulled or built
