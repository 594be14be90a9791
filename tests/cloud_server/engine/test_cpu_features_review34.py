"""cloud_server's oneDNN cap (``cloud_server/cpu_features.py``): on a CPU with AMX, importing
cloud_server sets ONEDNN_MAX_CPU_ISA below AMX (unless the user set it) so that a bf16 matmul's row
is the same whatever the number of rows, which batched-equals-alone in the engine rests on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cloud_server import cpu_features
from cloud_server.cpu_features import CAPPED_ISA, ISA_VARIABLE, cap_onednn_isa, cpu_flags, onednn_cap

AMX = {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}


def test_the_cap_is_set_only_for_amx_and_never_over_a_users_value():
    assert onednn_cap(AMX, {}) == CAPPED_ISA
    assert onednn_cap({"avx512f", "avx512_bf16", "avx512_vnni"}, {}) is None  # AMD Zen 4: no AMX
    assert onednn_cap({"avx2"}, {}) is None
    assert onednn_cap(AMX, {ISA_VARIABLE: "ALL"}) is None
    env: dict[str, str] = {}
    assert cap_onednn_isa(env, AMX) in ("capped", "late")  # late where torch is already imported
    assert env == {ISA_VARIABLE: CAPPED_ISA}
    env = {ISA_VARIABLE: "AVX2"}
    assert cap_onednn_isa(env, AMX) == "user" and env == {ISA_VARIABLE: "AVX2"}
    env = {}
    assert cap_onednn_isa(env, {"avx2", "fma"}) == "not needed" and env == {}
    assert cpu_features.onednn_cap_state() == "not needed"


def test_cpu_flags_read_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\nprocessor\t: 1\nflags\t: other\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


_CHILD = r"""
import json, os, sys
import cloud_server
from cloud_server.cpu_features import onednn_cap_state
torch_before = "torch" in sys.modules
import torch
torch.manual_seed(0)
bad = {}
# a prefill chunk's probs @ v (3 key heads, 200 queries x 3 heads, 300 keys) and a linear layer:
# each row computed alone must equal the same row computed with the others
for name, (m, k, n, batch) in {"attention": (600, 300, 64, (3, 1)), "linear": (200, 576, 1536, ())}.items():
    a, b = torch.randn(*batch, m, k).bfloat16(), torch.randn(*batch, k, n).bfloat16()
    full = torch.matmul(a, b)
    alone = [torch.matmul(a[..., i:i + 1, :], b) for i in range(m)]
    bad[name] = [i for i in range(m) if not torch.equal(alone[i], full[..., i:i + 1, :])]
print(json.dumps({"isa": os.environ.get("ONEDNN_MAX_CPU_ISA"), "state": onednn_cap_state(),
                  "torch_before": torch_before, "bad": bad}))
"""


def _child() -> dict:
    env = {k: v for k, v in os.environ.items() if k != ISA_VARIABLE}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_cloud_server_makes_a_bf16_row_the_same_alone_and_batched():
    got = _child()
    assert got["torch_before"] is False  # the cap is set before torch is even imported
    if {"amx_bf16", "avx512_bf16"} <= cpu_flags() and sys.platform == "linux":
        assert (got["isa"], got["state"]) == (CAPPED_ISA, "capped")
    else:
        assert (got["isa"], got["state"]) == (None, "not needed")
    assert got["bad"] == {"attention": [], "linear": []}


_LATE = r"""
import json, logging, sys
import torch
torch.matmul(torch.ones(3, 1, 600, 300).bfloat16(), torch.ones(3, 1, 300, 64).bfloat16())  # oneDNN set up
import cloud_server
from cloud_server.cpu_features import bf16_rows_invariant, onednn_cap_state
out = {"state": onednn_cap_state(), "invariant": bf16_rows_invariant(), "warned": None}
if len(sys.argv) > 1:
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("cloud_server.engine.llm_engine").addHandler(handler)
    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine
    LLMEngine(EngineConfig(sys.argv[1], max_model_len=256, kv_cache_memory_bytes=16 << 20))
    out["warned"] = any("ONEDNN_MAX_CPU_ISA" in r.getMessage() for r in records)
print(json.dumps(out))
"""


def _late(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != ISA_VARIABLE}
    done = subprocess.run([sys.executable, "-c", _LATE, *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _amx() -> bool:
    return {"amx_bf16", "avx512_bf16"} <= cpu_flags() and sys.platform == "linux"


def test_a_cap_set_after_torchs_first_bf16_matmul_is_seen_as_not_holding():
    got = _late()
    if _amx():  # oneDNN read the variable before cloud_server set it: its AMX kernels stay
        assert got == {"state": "late", "invariant": False, "warned": None}
    else:
        assert got["state"] in ("late", "not needed") and got["invariant"] is True


@pytest.mark.real
def test_the_engine_warns_when_the_cap_came_too_late(smollm2_path):
    got = _late(str(smollm2_path))
    assert got["warned"] is (not got["invariant"])
    assert got["warned"] is _amx()


@pytest.mark.real
def test_the_start_up_line_names_the_cap(smollm2_engine):
    """The server's "model ... ready" line says how far oneDNN may go on this CPU."""
    text = smollm2_engine.describe()
    assert ("oneDNN up to AVX512_CORE_BF16" in text) is (os.environ.get(ISA_VARIABLE) == CAPPED_ISA)
    assert ("oneDNN up to" in text) is bool(os.environ.get(ISA_VARIABLE))
    assert (os.environ.get(ISA_VARIABLE) == CAPPED_ISA) is _amx()
