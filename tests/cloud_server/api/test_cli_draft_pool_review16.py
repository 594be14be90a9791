"""Review 16: a ``--draft-model`` keeps a KV pool of its own beside the target's (as many blocks,
at the draft's bytes a token), beyond ``--kv-cache-memory-mb``. The start-up check compared only
the target's pool with a CPU's memory: a pool that fit alone but not with the draft's started the
server (and the engine mapped both). Now the two together are checked, and the refusal says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cloud_server.__main__ as cli
from cloud_server.cli_checks import _check_device, _check_model_header
from cloud_server.cli_settings import _engine_config

from .test_cli_header_review15 import gguf_header

MIB = 1 << 20


@pytest.fixture(autouse=True)
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    def listen(*args: object, **kwargs: object) -> None:
        raise AssertionError("the port was bound: the setting was not refused before the start")

    monkeypatch.setattr(cli, "listen", listen)


def _memory(monkeypatch: pytest.MonkeyPatch, total: int) -> None:
    """This machine has ``total`` bytes of memory, as ``os.sysconf`` tells it."""
    real = os.sysconf

    def sysconf(name: str | int) -> int:
        if name == "SC_PAGE_SIZE":
            return 4096
        if name == "SC_PHYS_PAGES":
            return total // 4096
        return real(name)

    monkeypatch.setattr(os, "sysconf", sysconf)


def _models(tmp_path: Path) -> tuple[Path, Path]:
    # gguf_header: 2 layers x 4 KV heads x 16 x 2 (K, V) x 2 bytes (bf16) = 512 bytes a token, so
    # 1 MiB holds 2,048 tokens, one whole sequence of the header's 2,048; the draft is the same
    # model with no more layers, so its pool is as large: 1 MiB more
    return gguf_header(tmp_path / "target.gguf"), gguf_header(tmp_path / "draft.gguf")


def test_the_draft_pool_counts_against_a_cpus_memory(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    target, draft = _models(tmp_path)
    _memory(monkeypatch, 3 * MIB // 2)  # the target's 1 MiB fits, with the draft's 1 MiB not
    code = cli.main(["serve", "--port", "0", "--model", str(target), "--device", "cpu",
                     "--kv-cache-memory-mb", "1", "--speculative-method", "draft",
                     "--draft-model", str(draft)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "--kv-cache-memory-mb 1 and the draft model's own KV pool of 1 MiB" in err
    assert "this machine's memory (1 MiB)" in err and str(draft) in err


def test_a_draft_pool_that_fits_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target, draft = _models(tmp_path)
    _memory(monkeypatch, 2 * MIB)  # exactly both pools
    parser = cli.build_parser()
    for options in (["--speculative-method", "draft", "--draft-model", str(draft)],
                    ["--replicas", "2", "--speculative-method", "draft",
                     "--draft-model", str(draft)],  # a replica's memory is its own
                    []):
        args = parser.parse_args(["serve", "--model", str(target), "--device", "cpu",
                                  "--kv-cache-memory-mb", "1", *options])
        _check_device(_engine_config(args))
        _check_model_header(args, _engine_config(args), args.replicas is not None)
