"""`router train --weight` given a count that does not match --data is a usage error: exit 2."""

from __future__ import annotations

import pytest

from hybridllm.cli import main


def test_weight_count_mismatch_is_a_usage_error_before_any_file_is_read(capsys, tmp_path):
    argv = ["router", "train", "--data", str(tmp_path / "a.csv"), "--data", str(tmp_path / "b.csv"),
            "--weight", "1", "--out", str(tmp_path / "r"), "--no-embedding"]
    with pytest.raises(SystemExit) as rc:  # was a DataError: exit 1, unlike --weight 0 (exit 2)
        main(argv)
    err = capsys.readouterr().err
    assert rc.value.code == 2
    assert err.startswith("hybridllm router train: error: give one --weight per --data file "
                          "(2 files, 1 weights)")
    assert "see hybridllm router train --help" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
