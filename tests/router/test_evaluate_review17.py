"""`router eval --plot`: the file it names is the file written; a path it cannot write is a
one-line error, not an internal error."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from hybridllm._exceptions import DataError  # noqa: E402
from hybridllm.router.evaluate import plot_curves, quality_curve  # noqa: E402


def _curves():
    return {"router": quality_curve([1.0, 0.0, 0.5], [0, 1, 0], [1, 1, 1])}


def test_a_plot_without_extension_reports_the_file_written(tmp_path):
    """matplotlib writes "curve" as "curve.png"; the output said "plot": "curve", no such file."""
    out = plot_curves(_curves(), tmp_path / "curve")
    assert out == tmp_path / "curve.png" and out.is_file()
    assert plot_curves(_curves(), tmp_path / "c.svg") == tmp_path / "c.svg"


@pytest.mark.parametrize("target", ["x.xyz", "afile/x.png", "adir.png"])
def test_a_plot_path_that_cannot_be_written_is_a_clear_error(tmp_path, target):
    """An unknown extension (ValueError), a file where a folder should be (FileExistsError), a
    folder named like the plot (IsADirectoryError): "internal error ... please report it"."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir.png").mkdir()
    with pytest.raises(DataError, match="--plot"):
        plot_curves(_curves(), tmp_path / target)


def test_has_gap_is_the_metrics_rule():
    from hybridllm.router.evaluate import has_gap

    assert has_gap(0.5, 0.6) and not has_gap(0.6, 0.5) and not has_gap(0.5, 0.5)
    assert not has_gap(sum([0.3, 0.2, 0.1]) / 3, sum([0.1, 0.2, 0.3]) / 3)  # one bit apart
