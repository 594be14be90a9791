"""``export_onnx`` writes its graph whole or not at all (review 17): before, a failed or
interrupted ``torch.onnx.export`` left a truncated file over the graph already at the path.
Fast: the exporter itself is stood in for (torch is imported, no model is traced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hybridllm.cache.export import export_onnx  # noqa: E402


def _stand_in(fail: bool):
    def export(_model: Any, _inputs: Any, f: str, **_kw: Any) -> None:
        Path(f).write_bytes(b"new graph, half")
        if fail:
            raise RuntimeError("Unsupported operator")  # as torch's exporter stops midway
        with open(f, "ab") as out:
            out.write(b", and the rest")
    return export


def test_a_failed_export_keeps_the_graph_already_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "reranker.onnx"
    path.write_bytes(b"old graph")
    monkeypatch.setattr(torch.onnx, "export", _stand_in(fail=True))
    with pytest.raises(RuntimeError, match="Unsupported"):
        export_onnx(object(), path)
    assert path.read_bytes() == b"old graph"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reranker.onnx"]  # no temporary file left


def test_an_export_replaces_the_graph_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "reranker.onnx"
    path.write_bytes(b"old graph")
    monkeypatch.setattr(torch.onnx, "export", _stand_in(fail=False))
    export_onnx(object(), path)
    assert path.read_bytes() == b"new graph, half, and the rest"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reranker.onnx"]
