"""The ONNX export: two processes racing to prepare the embedder end with one good copy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.real

RACER = (
    "import sys; from pathlib import Path; from hybridllm.cache.export import export; "
    "export(source_dir=Path(sys.argv[1]), out_dir=Path(sys.argv[2]), progress=print)"
)


def test_concurrent_exports_are_serialized_and_atomic(tmp_path: Path, minilm_dir: Path) -> None:
    pytest.importorskip("torch")
    from hybridllm.cache.export import FP32_NAME, INT8_NAME, is_exported

    out = tmp_path / "embedder"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(minilm_dir), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(2)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    # the lock makes the second process find the work done instead of exporting again
    assert sum("exporting" in log for log in logs) == 1, logs
    assert is_exported(out)
    assert not list(out.glob("*.tmp")), "temporary files left behind"

    import onnxruntime as ort

    for name in (FP32_NAME, INT8_NAME):
        session = ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids}
        (vec,) = session.run(None, feed)
        assert vec.shape == (1, 384) and abs(float(np.linalg.norm(vec)) - 1.0) < 1e-3
