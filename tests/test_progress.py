"""The CLI's progress bar: amounts for downloads, percent and time for builds."""

from __future__ import annotations

import io

from hybridllm._progress import ProgressBar


def _lines(bar: ProgressBar, calls) -> list[str]:
    for done, total in calls:
        bar(done, total)
    return bar.stream.getvalue().splitlines()


def test_download_bar_shows_amounts():
    lines = _lines(ProgressBar("Pulling m", stream=io.StringIO(), quiet_for=0), [(0, 2e6), (2e6, 2e6)])
    assert lines[-1].startswith("Pulling m [") and "100% 2.0/2.0 MB" in lines[-1]


def test_counted_things_are_whole_numbers():
    lines = _lines(ProgressBar("embedding prompts", unit="prompts", scale=1, stream=io.StringIO(),
                               quiet_for=0), [(256, 10399), (10399, 10399)])
    assert "100% 10399/10399 prompts" in lines[-1] and "2% 256/10399 prompts" in lines[0]


def test_build_bar_shows_percent_and_time_not_megabytes():
    dl = ProgressBar("Preparing m", stream=io.StringIO(), quiet_for=0)
    lines = _lines(dl.for_steps(" for ONNX Runtime (int4)"), [(0, 100), (50, 100), (100, 100)])
    assert [x.split("] ")[1].split()[0] for x in lines] == ["0%", "50%", "100%"]
    assert all(x.startswith("Preparing m for ONNX Runtime (int4) [") for x in lines)
    assert not any("MB" in x for x in lines)


def test_resolve_onnx_hands_the_build_a_percent_bar(monkeypatch, tmp_path):
    from hybridllm.models import onnx_prepare, onnx_store

    seen: list[str] = []

    def fake_prepare(model_id, *, precision, progress):
        progress(50, 100)
        seen.extend(progress.stream.getvalue().splitlines())
        return tmp_path

    monkeypatch.setattr(onnx_store, "is_prepared", lambda folder, spec: False)
    monkeypatch.setattr(onnx_store, "missing_export_modules", lambda: [])
    monkeypatch.setattr(onnx_prepare, "prepare_onnx", fake_prepare)
    bar = ProgressBar("Preparing smollm2-135m-instruct", stream=io.StringIO(), quiet_for=0)
    onnx_store.resolve_onnx("smollm2-135m-instruct", progress=bar)
    assert seen and "50%" in seen[-1] and "MB" not in seen[-1], seen
