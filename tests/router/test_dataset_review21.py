"""A score column outside the --score-range given is said to be outside that range (it was an
internal KeyError when the columns' names did not tell the weak from the strong model, and asked
for the --score-range already passed when they did)."""

from __future__ import annotations

import pytest

from hybridllm._exceptions import DataError
from hybridllm.cli import main
from hybridllm.router.dataset import load_routellm_csv


def _write(tmp_path, cols, cells):
    path = tmp_path / "g.csv"
    rows = "".join(f"p{i} {'x ' * i},{a},{b}\n" for i, (a, b) in enumerate(cells))
    path.write_text(f"prompt,{cols[0]},{cols[1]}\n" + rows)
    return path


@pytest.mark.parametrize("cols", [("m1", "m2"), ("weak", "strong")])
def test_column_below_the_range(tmp_path, cols):
    path = _write(tmp_path, cols, [((i % 5) / 5, (i % 7) / 6) for i in range(30)])
    with pytest.raises(DataError, match=r"outside --score-range 1,10"):
        load_routellm_csv(path, score_range=(1, 10))


def test_column_above_the_range_cli_one_line(tmp_path, capsys):
    path = _write(tmp_path, ("m1", "m2"), [(i % 5 + 1, i % 7 + 12) for i in range(30)])
    assert main(["router", "train", "--data", str(path), "--out", str(tmp_path / "r"),
                 "--no-embedding", "--score-range", "1,10"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Column 'm2'") and "outside --score-range 1,10" in err
    assert "internal error" not in err and err.count("\n") == 1


def test_in_range_still_loads(tmp_path):
    path = _write(tmp_path, ("m1", "m2"), [(i % 5 + 1, i % 7 + 3) for i in range(30)])
    data = load_routellm_csv(path, score_range=(1, 10))
    assert data.weak.max() <= 1 and data.strong.min() >= 0


def test_no_range_message_unchanged(tmp_path):
    path = _write(tmp_path, ("weak", "strong"), [(i % 5 / 5, 3) for i in range(30)])
    with pytest.raises(DataError, match=r"outside \[0, 1\]: pass their scale with --score-range"):
        load_routellm_csv(path, weak_col="weak", strong_col="strong")
