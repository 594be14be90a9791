"""A pulled model is the installed package's own file (a hard link), not a second copy on the disk.

Before, every pull copied: each model took its size twice on the disk (the 1.5B cloud model's GGUF
is 1.1 GB), and the suite's many pulls filled a small CI disk. The stand-in catalog and package of
``test_pull_leftovers_review29`` keep these fast and leave the real packages alone."""

from __future__ import annotations

import errno
import json
import os

import pytest

from hybridllm import ModelCorruptError
from hybridllm.cli import main
from hybridllm.models import store
from hybridllm.models.remove import disk_usage, linked_usage, remove

from . import test_pull_leftovers_review29 as _stand_in
from .test_pull_leftovers_review29 import EXTRA, MAIN, TINY, _installed, _tree

tiny = _stand_in.tiny  # the fixture: a data dir with the stand-in catalog


def _package_file(tmp_path, name="Tiny.gguf"):
    return tmp_path / "wheel" / "m" / name


def test_a_pulled_file_is_the_packages_own_file(tiny, tmp_path, monkeypatch):
    _installed(monkeypatch, tmp_path)
    seen = []
    path = store.pull(TINY, progress=lambda done, total: seen.append((done, total)))
    assert os.path.samefile(path, _package_file(tmp_path))  # one file on the disk, two names
    assert os.path.samefile(path.parent / "sub" / "extra.bin", _package_file(tmp_path, "sub/extra.bin"))
    assert path.read_bytes() == MAIN and store.is_materialized(TINY)
    assert seen[-1] == (len(MAIN) + len(EXTRA),) * 2  # the hash of the linked files is the progress
    assert not [p for p in path.parent.rglob("*.tmp")]


def test_where_no_link_can_be_made_the_file_is_copied(tiny, tmp_path, monkeypatch):
    """The data dir on another file system (or one without links: FAT, some network mounts)."""
    _installed(monkeypatch, tmp_path)

    def elsewhere(_src, _dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(store.os, "link", elsewhere)
    path = store.pull(TINY)
    assert not os.path.samefile(path, _package_file(tmp_path))
    assert path.read_bytes() == MAIN and store.is_materialized(TINY)


def test_a_damaged_package_file_is_not_linked(tiny, tmp_path, monkeypatch):
    """Checked before its name is given: a link to a damaged file is removed, and the error names
    the reinstall, as a copy's does."""
    _installed(monkeypatch, tmp_path)
    _package_file(tmp_path).write_bytes(MAIN[:-1] + b"\x00")  # the right size, one byte wrong
    with pytest.raises(ModelCorruptError, match="sha256.*Reinstall it with: pip install no-such-package-29"):
        store.pull(TINY)
    assert _tree(tiny) == []  # no link under the file's name, nor a temporary one


def test_damage_written_into_a_linked_file_names_the_reinstall_first(tiny, tmp_path, monkeypatch, capsys):
    """A write into the pulled file is a write into the package's: `pull --force` alone cannot mend
    it (it would link the damage again), so `verify` and loading by path say to reinstall first."""
    _installed(monkeypatch, tmp_path)
    path = store.pull(TINY)
    with path.open("r+b") as f:
        f.seek(10)
        f.write(b"\xff")
    [result] = store.verify(TINY)
    assert result.status == "corrupt"
    reinstall = "pip install no-such-package-29==1.0 --force-reinstall"
    assert f"{reinstall}`, then `hybridllm models pull {TINY} --force`" in result.detail
    with pytest.raises(ModelCorruptError, match=f"{reinstall}, then hybridllm models pull {TINY} --force"):
        store.resolve_gguf(str(path))
    # reinstalled (pip writes new files), the pull mends it
    _package_file(tmp_path).unlink()
    _package_file(tmp_path).write_bytes(MAIN)
    assert main(["models", "pull", TINY, "--force"]) == 0
    assert path.read_bytes() == MAIN and store.verify(TINY)[0].status == "ok"
    capsys.readouterr()


def test_damage_in_a_copied_file_still_says_pull_force_only(tiny, tmp_path, monkeypatch):
    _installed(monkeypatch, tmp_path)
    path = store.pull(TINY)
    other = path.with_name("other")
    other.write_bytes(MAIN[:10] + b"\xff" + MAIN[11:])
    os.replace(other, path)
    [result] = store.verify(TINY)
    assert result.detail == f"checksum mismatch: Tiny.gguf; run `hybridllm models pull {TINY} --force`"
    assert store.pull(TINY) == path and path.read_bytes() == MAIN  # and it does


def test_sizes_count_a_linked_file_as_the_packages_not_the_models(tiny, tmp_path, monkeypatch, capsys):
    """`models list` said a linked model took its size on the disk, and `models remove` that it
    freed it, while the data stayed under the package's name."""
    _installed(monkeypatch, tmp_path)
    path = store.pull(TINY)
    markers = sum(p.stat().st_size for p in path.parent.rglob(".*.verified"))
    assert (disk_usage(TINY), linked_usage(TINY)) == (markers, len(MAIN) + len(EXTRA))
    assert main(["models", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["disk_bytes"], row["linked_bytes"]) == (markers, len(MAIN) + len(EXTRA))
    assert main(["models", "list"]) == 0
    out, err = capsys.readouterr()
    assert f"linked: {TINY} (" in err and "no space beyond the packages'" in err
    assert remove(TINY) and disk_usage(TINY) == linked_usage(TINY) == 0
    assert _package_file(tmp_path).read_bytes() == MAIN  # the package keeps its file


def test_a_copied_model_counts_as_its_own(tiny, tmp_path, monkeypatch, capsys):
    _installed(monkeypatch, tmp_path)
    monkeypatch.setattr(store.os, "link", lambda *_: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    path = store.pull(TINY)
    markers = sum(p.stat().st_size for p in path.parent.rglob(".*.verified"))
    assert (disk_usage(TINY), linked_usage(TINY)) == (markers + len(MAIN) + len(EXTRA), 0)
    assert main(["models", "list"]) == 0
    assert "linked:" not in capsys.readouterr().err
