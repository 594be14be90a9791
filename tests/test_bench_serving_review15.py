"""bench.serving: its count options are hybridllm._cli_options.positive_int (one rule, one message),
and stopping a server closes the file its stderr went to."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from bench import serving


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "many"])
def test_a_count_below_one_or_not_whole_is_refused_naming_the_option(value, capsys):
    with pytest.raises(SystemExit) as exc:
        serving.main(["--num-requests", value])
    assert exc.value.code == 2
    assert f"argument --num-requests: expected a positive integer, got {value!r}" in capsys.readouterr().err


def test_stopping_a_server_closes_its_log_file():
    # was left open until the process object was garbage-collected (a ResourceWarning then)
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stderr=log)
    proc.log = log  # as start_server attaches it
    serving.stop_server(proc)
    assert proc.returncode is not None and log.closed
    serving.stop_server(proc)  # a second stop is harmless
