"""`hybridllm serve`'s numeric options refuse nonsense while parsing: one usage line naming the
option and what it takes, exit status 2, before a socket is bound or a model loads.

Before: ``--threshold`` was a bare ``float``: ``nan``, ``inf``, ``-1`` and ``1.5`` parsed, the port
was bound, and only building the client raised ``ConfigError: threshold must be in [0, 1]``
(``--threshold nan`` included: NaN fails the config's range check too, later).
"""

from __future__ import annotations

import pytest

from hybridllm import cli

BAD = [
    (["--threshold", "nan"], "--threshold", "expected a number from 0 to 1"),
    (["--threshold", "inf"], "--threshold", "expected a number from 0 to 1"),
    (["--threshold=-inf"], "--threshold", "expected a number from 0 to 1"),
    (["--threshold", "-0.1"], "--threshold", "expected a number from 0 to 1"),
    (["--threshold", "1.5"], "--threshold", "expected a number from 0 to 1"),
    (["--threshold", "half"], "--threshold", "expected a number from 0 to 1"),
    (["--port", "65536"], "--port", "port must be in 0-65535"),
    (["--port", "-1"], "--port", "expected an integer >= 0"),
    (["--port", "80.5"], "--port", "expected an integer >= 0"),
    (["--max-body-bytes", "0"], "--max-body-bytes", "expected a positive integer"),
    (["--max-body-bytes", "4e6"], "--max-body-bytes", "expected a positive integer"),
    (["--shutdown-timeout", "nan"], "--shutdown-timeout", "expected a number >= 0"),
    (["--shutdown-timeout", "inf"], "--shutdown-timeout", "expected a number >= 0"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout", "expected a number >= 0"),
]


@pytest.mark.parametrize(("argv", "option", "says"), BAD)
def test_a_bad_number_is_a_one_line_usage_error_before_anything_runs(monkeypatch, capsys, argv, option,
                                                                     says):
    monkeypatch.setattr("hybridllm._serve_cli.cmd_serve", lambda args: pytest.fail("it ran"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", *argv])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith(f"hybridllm serve: error: argument {option}: {says}"), lines[0]


@pytest.mark.parametrize(("value", "parsed"), [("0", 0.0), ("1", 1.0), ("0.5595", 0.5595), ("1e-3", 0.001)])
def test_a_threshold_from_0_to_1_is_taken_and_reaches_the_settings(value, parsed):
    from hybridllm._serve_cli import _settings

    args = cli.build_parser().parse_args(["serve", "--threshold", value])
    assert args.threshold == parsed and _settings(args)["threshold"] == parsed


def test_the_help_gives_the_thresholds_range(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--threshold T the router's threshold, a number from 0 to 1" in help_text, help_text
