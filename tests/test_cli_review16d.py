"""CLI review 16d: no command is a usage error on stderr, a missing or empty --config is a usage
error for every command that takes it, a blank --system is refused, and `python -m hybridllm.demo
| head` ends quietly. Fast: nothing is loaded."""

from __future__ import annotations

import io

import pytest

from hybridllm import _chat_cli, cli, demo


def test_no_command_is_a_usage_error_on_stderr(capsys):
    """Before: the help went to stdout with exit status 2."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    assert err.startswith("hybridllm: error: a command is required: chat, ask, models"), err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["config", "show"], ["serve", "--port", "0"]])
def test_a_missing_config_file_is_a_usage_error_everywhere(tmp_path, capsys, command):
    """Before: `config show --config missing.toml` exited 1, `serve` with the same mistake 2."""
    missing = tmp_path / "missing.toml"
    assert cli.main([*command, "--config", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"hybridllm {command[0]}: error: argument --config: {missing} does not "
                          "exist"), err


def test_an_empty_config_option_is_not_silently_ignored(tmp_path, capsys, monkeypatch):
    """Before: `--config ""` was taken as no option, and the settings came from elsewhere."""
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(tmp_path / "elsewhere.toml"))
    (tmp_path / "elsewhere.toml").write_text("max_tokens = 7\n")
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error, as the script exits
        cli.main(["config", "show", "--config", ""])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "argument --config" in err, (out, err)


def test_an_existing_config_file_still_shows(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("max_tokens = 7\n")
    assert cli.main(["config", "show", "--config", str(path)]) == 0
    assert '"max_tokens": 7' in capsys.readouterr().out


@pytest.mark.parametrize("command", ["ask", "chat"])
@pytest.mark.parametrize("system", ["   ", "", "\n\t"])
def test_a_blank_system_prompt_is_a_usage_error(monkeypatch, capsys, command, system):
    """Before: `ask --system "  "` sent a system prompt of spaces (and `--system ""` none, silently)."""
    def no_client(args):
        raise AssertionError("the client was built")

    monkeypatch.setattr(_chat_cli, "_client", no_client)
    argv = [command, "--system", system, *(["hi"] if command == "ask" else [])]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith(f"hybridllm {command}: error: argument --system: "), err


def test_a_system_prompt_with_text_is_kept_as_given():
    args = cli.build_parser().parse_args(["ask", "--system", "  Be brief. ", "hi"])
    assert _chat_cli._messages(args, "hi")[0] == {"role": "system", "content": "  Be brief. "}


class ClosedPipe(io.StringIO):
    """A stdout whose reader has gone (`| head`): every write fails."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_the_demo_into_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    """Before: `python -m hybridllm.demo | head` ended in a BrokenPipeError traceback."""
    monkeypatch.setattr(cli, "SERVER_MODULES", ("sys",))  # the [server] extra counts as installed
    started = []
    monkeypatch.setattr(demo, "_start_cloud", lambda *a, **k: started.append(a))
    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert demo.main([]) == 0
    assert started == []  # the first line failed: no server was started
    assert capsys.readouterr().err == ""


class Server:
    def __init__(self):
        self.killed = False

    def poll(self):
        return 0 if self.killed else None

    def kill(self):
        self.killed = True

    def wait(self, timeout=None):
        return 0


class Buffered(io.StringIO):
    """A pipe whose reader goes after the first line: writes are kept, the flush that sends the
    rest fails, as a block-buffered stdout's does."""

    def __init__(self):
        super().__init__()
        self.flushes = 0

    def flush(self):
        self.flushes += 1
        if self.flushes > 1:
            raise BrokenPipeError(32, "Broken pipe")


def test_the_demo_stops_its_server_when_the_reader_goes(monkeypatch, capsys):
    """A pipe closed once the server runs: exit 0, no traceback, and the server is stopped."""
    monkeypatch.setattr(cli, "SERVER_MODULES", ("sys",))
    server = Server()
    monkeypatch.setattr(demo, "_start_cloud", lambda *a, **k: server)
    monkeypatch.setattr("sys.stdout", Buffered())
    import hybridllm.router as router

    monkeypatch.setattr(router, "load_router", lambda: type("R", (), {"threshold": 0.5})())
    assert demo.main([]) == 0
    assert server.killed
    assert capsys.readouterr().err == ""
