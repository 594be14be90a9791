"""The engine's own CPU kernels (``cloud_server/layers/cpu_kernels.cpp``): weight-only int4 and int8
(groups of 32, scale and zero) matmuls whose activations are rounded to int8 per row and group of
32 (d = max |x| / 127), with integer dot products.

- Both agree with the float64 product of the dequantized weights and the activations rounded that
  way (the zero term with the exact group sums) to fp32 rounding (relative error < 1e-5), and with
  the unrounded product to the rounding's own error (about 5e-3 on random data).
- A row's result does not depend on its batch: each row of a 1..13-row call equals, bit for bit,
  that row computed alone, and one thread gives what two give. Speculative verification relies on
  it (a verify row must equal the plain decode row).
- ``Linear.first_rows`` on the kernels' formats equals the first outputs of the whole layer.
- Without the kernels (``HYBRIDLLM_CPU_KERNELS=0``, or a failed build) layers fall back to torch's
  formats (int8 groups become one scale per row), with one warning for a failed build; a damaged
  library file in the cache is rebuilt.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from cloud_server.layers import cpu_kernels  # noqa: E402
from cloud_server.layers.linear import (  # noqa: E402
    Linear,
    int4_dequantize,
    int8_groups_dequantize,
    pack_int4_blocks,
    pack_int4_codes,
    pack_int8_blocks,
    pack_int8_scales,
)


@pytest.fixture
def _kernels():
    """Skips where the kernels cannot be built. A fixture, not a skipif evaluated at import: that
    built them at collection, before the session's isolated HYBRIDLLM_CACHE_DIR was set, into the
    user's own cache folder."""
    if cpu_kernels.int4_mm() is None:
        pytest.skip("the engine's CPU kernels need x86-64 AVX-512 VNNI and g++")


needs_kernels = pytest.mark.usefixtures("_kernels")


def _int4(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    sz = (torch.randn(n, k // 32, 2, generator=g) * 0.02).to(torch.bfloat16)
    codes = pack_int4_codes(q)
    return codes, sz, int4_dequantize(codes, sz)  # reference weights, fp32 of the bf16 scales


def _int8(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    sz = (torch.randn(n, k // 32, 2, generator=g) * 0.01).to(torch.float16)  # zeros too (Q4_1-like)
    return q, sz, int8_groups_dequantize(q, sz)


def _rounded_product(x: torch.Tensor, ref_w: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """x [M, K] times the weights [N, K] as the kernels compute it, in float64: the activations
    rounded to int8 per group of 32 meet the weights less their zeros; the zeros [N, K / 32] meet
    the groups' exact sums."""
    xg = x.double().reshape(x.shape[0], -1, 32)
    amax = xg.abs().amax(-1, keepdim=True)
    step = (amax.float() / 127).double()  # the kernel's fp32 step
    # 127 / amax in fp32 as a true division (a Python number over a tensor is a reciprocal times
    # 127 in torch, one ulp off at times, which moves a tie); then x times it, to nearest even
    inv = torch.full_like(amax, 127.0).float() / amax.float()
    a = torch.round(xg.float() * torch.where(amax > 0, inv, torch.zeros_like(inv))).double()
    z = zeros.double()
    w = ref_w.double() - z.repeat_interleave(32, dim=1)
    return (a * step).reshape(x.shape) @ w.T + xg.sum(-1) @ z.T


SHAPES = [(48, 64), (576, 576), (1152, 896), (80, 1536)]  # rows not a multiple of 64, K of 2 to 48 groups


@needs_kernels
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_int4_kernel_matches_the_dequantized_weights_and_is_row_invariant(n, k):
    codes, sz, ref_w = _int4(n, k, seed=n + k)
    w = pack_int4_blocks(codes, sz)
    mm = cpu_kernels.int4_mm()
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x[3, :32] = 0  # a group of zeros rounds to zeros
    want = _rounded_product(x, ref_w, sz[..., 1].float())
    unrounded = x.double() @ ref_w.double().T
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17):
        y = mm(x[:m].contiguous(), w, n)
        assert y.dtype == torch.float32 and y.shape == (m, n)
        err = ((y - want[:m]).norm() / want[:m].norm()).item()
        assert err < 1e-5, (m, err)
        err = ((y - unrounded[:m]).norm() / unrounded[:m].norm()).item()
        assert err < 1e-2, (m, err)
        for r in range(m):  # each row as computed alone, bit for bit
            assert torch.equal(y[r], mm(x[r : r + 1].contiguous(), w, n)[0]), (m, r)


@needs_kernels
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_int8_kernel_matches_the_dequantized_weights_and_is_row_invariant(n, k):
    q, sz, ref_w = _int8(n, k, seed=n * k)
    w, s = pack_int8_blocks(q), pack_int8_scales(sz)
    mm = cpu_kernels.int8_mm()
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    want = _rounded_product(x, ref_w, sz[..., 1].float())
    unrounded = x.double() @ ref_w.double().T
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17):
        y = mm(x[:m].contiguous(), w, s)
        assert y.dtype == torch.float32 and y.shape == (m, n)
        err = ((y - want[:m]).norm() / want[:m].norm()).item()
        assert err < 1e-5, (m, err)
        err = ((y - unrounded[:m]).norm() / unrounded[:m].norm()).item()
        assert err < 1e-2, (m, err)
        for r in range(m):
            assert torch.equal(y[r], mm(x[r : r + 1].contiguous(), w, s)[0]), (m, r)


@needs_kernels
def test_threads_do_not_change_a_result():
    codes, sz, _ = _int4(1152, 896, seed=3)
    q, sz8, _ = _int8(1152, 896, seed=4)
    w4, w8, s8 = pack_int4_blocks(codes, sz), pack_int8_blocks(q), pack_int8_scales(sz8)
    x = torch.randn(6, 896, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append((cpu_kernels.int4_mm()(x, w4, 1152), cpu_kernels.int8_mm()(x, w8, s8)))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@needs_kernels
def test_linear_layers_use_the_kernels_and_cut_heads_at_whole_blocks():
    codes, sz, ref4 = _int4(256, 576, seed=6)
    q, sz8, ref8 = _int8(256, 576, seed=7)
    rows = torch.randint(-127, 128, (256, 576), dtype=torch.int8, generator=torch.Generator().manual_seed(13))
    row_scale = torch.rand(256, generator=torch.Generator().manual_seed(14)) * 0.01 + 1e-3
    ref_rows = rows.float() * row_scale.to(torch.float16).float().unsqueeze(1)  # fp16, as groups
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    for weight, s, ref in ((codes, sz, ref4), (q, sz8, ref8), (rows, row_scale, ref_rows)):
        layer = Linear(576, 256)
        layer.load(weight, scale=s)
        assert layer.blocks
        y = layer(x)
        assert y.dtype == torch.bfloat16
        want = x.float() @ ref.T
        # the activations' int8 rounding (about 5e-3) and the output's bf16 rounding (2e-3)
        assert ((y.float() - want).norm() / want.norm()).item() < 1e-2
        head = layer.first_rows(100)  # whole blocks of 16 rows: 96
        assert head.out_features == 96 and head.weight.data_ptr() == layer.weight.data_ptr()
        assert torch.equal(head(x), y[:, :96])
    # fp32 activations: the kernels round them to bf16, as torch's int4 kernel does
    assert torch.equal(layer(x.float()).to(torch.bfloat16), layer(x))


def test_without_the_kernels_layers_use_torchs_formats(torchs_kernels):
    codes, sz, ref = _int4(128, 256, seed=9)
    layer = Linear(256, 128)
    layer.load(codes, scale=sz)
    assert layer.int4 and not layer.blocks and layer.scale is not None  # torch's int4 packing
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    want = x.float() @ ref.T
    assert ((layer(x).float() - want).norm() / want.norm()).item() < 5e-3
    # int8 groups: one scale per row for torch's int8 kernel (rounded again: about 1% off)
    q, sz8, ref8 = _int8(128, 256, seed=15)
    layer = Linear(256, 128)
    layer.load(q, scale=sz8)
    assert not layer.blocks and layer.weight.shape == (128, 256) and layer.scale.shape == (128,)
    want = x.float() @ ref8.T
    assert ((layer(x).float() - want).norm() / want.norm()).item() < 2e-2


def test_the_kernels_build_and_load_wherever_the_cpu_and_a_compiler_allow(monkeypatch, tmp_path, caplog):
    # the other kernel tests skip where the kernels are not used: a source that no longer
    # compiles must fail here instead of turning them all into skips
    import platform
    import shutil

    if not (cpu_kernels._NEEDED_CPU_FLAGS <= cpu_kernels.cpu_flags() and platform.machine() == "x86_64"
            and shutil.which("g++") and cpu_kernels._enabled_by_env()):
        pytest.skip("this machine cannot use the kernels (no AVX-512 VNNI, no g++, or turned off)")
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))  # a build from the source, not a cached file
    monkeypatch.setattr(cpu_kernels, "_registered", lambda: True)  # this process may hold them already
    cpu_kernels.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="cloud_server.layers.cpu_kernels"):
            ops = cpu_kernels._ops()
        assert ops is not None, [r.getMessage() for r in caplog.records]
        assert list((tmp_path / "kernels").glob("cpu_kernels.*.so"))
    finally:
        cpu_kernels.reset()


def test_a_failed_build_falls_back_with_one_warning(monkeypatch, tmp_path, caplog):
    if cpu_kernels.int4_mm() is None:
        pytest.skip("no kernels to build on this CPU")
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    cpu_kernels.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="cloud_server.layers.cpu_kernels"):
            assert cpu_kernels.int4_mm() is None and cpu_kernels.int8_mm() is None
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "torch's int4 and int8 kernels instead" in warnings[0].getMessage()
        q, sz8, _ = _int8(64, 64, seed=11)
        layer = Linear(64, 64)
        layer.load(q, scale=sz8)
        assert not layer.blocks
    finally:
        cpu_kernels.reset()


def test_a_damaged_kernel_file_is_built_again(monkeypatch, tmp_path, caplog):
    if cpu_kernels.int4_mm() is None:
        pytest.skip("no kernels to build on this CPU")

    def load_library(path):  # what dlopen says of a file that is not a shared library; the ops
        with open(path, "rb") as fh:  # are not registered a second time in this process
            if fh.read(4) != b"\x7fELF":
                raise OSError(f"{path}: invalid ELF header")

    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "_registered", lambda: False)  # as in a fresh process
    monkeypatch.setattr(torch.ops, "load_library", load_library)
    cpu_kernels.reset()
    try:
        assert cpu_kernels._ops() is not None  # built into the empty cache dir
        (lib,) = (tmp_path / "kernels").glob("cpu_kernels.*.so")
        lib.write_bytes(b"truncated")  # damaged, by a full disk say
        cpu_kernels.reset()
        with caplog.at_level(logging.WARNING, logger="cloud_server.layers.cpu_kernels"):
            assert cpu_kernels._ops() is not None
        assert [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()]
        with open(lib, "rb") as fh:
            assert fh.read(4) == b"\x7fELF"  # a real library again
    finally:
        cpu_kernels.reset()


def test_int8_packing_in_place_matches_the_copy():
    q, _, _ = _int8(16 * 130, 128, seed=12)  # 130 blocks: two chunks of 64 and a short one
    want = pack_int8_blocks(q)
    mine = q.clone()
    got = pack_int8_blocks(mine, in_place=True)
    assert torch.equal(got, want) and got.data_ptr() == mine.data_ptr()
    assert got.dtype == torch.uint8 and not torch.equal(q.reshape(-1).view(torch.uint8), want)  # a new layout
