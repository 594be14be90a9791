"""The CLI honours the settings: edge_model from config.toml, every sampling flag."""

from __future__ import annotations

import pytest

from hybridllm import _chat_cli, _cli_terminal, cli


class Recorder:
    """Stands in for HybridLLM: records how the CLI built it and what it asked."""

    built: list[dict] = []
    asked: list[dict] = []

    def __init__(self, **kw):
        from hybridllm._config import load_config

        load_config(**{k: v for k, v in kw.items() if k not in ("progress",)})  # validates
        Recorder.built.append(kw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def chat(self, prompt, **params):
        from hybridllm import Completion

        Recorder.asked.append(params)
        return Completion(text="ok", route="edge", reason="r", model="m")


@pytest.fixture
def recorder(monkeypatch):
    Recorder.built, Recorder.asked = [], []
    monkeypatch.setattr("hybridllm._client.HybridLLM", Recorder)
    return Recorder


def test_edge_model_comes_from_config_toml_unless_model_is_given(tmp_path, monkeypatch, recorder):
    """Before: the CLI always passed edge_model (its own default), so config.toml was ignored."""
    from hybridllm._config import load_config

    toml = tmp_path / "config.toml"
    toml.write_text('edge_model = "gemma3-270m"\n')
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(toml))
    monkeypatch.delenv("HYBRIDLLM_EDGE_MODEL", raising=False)
    assert cli.main(["ask", "hi", "--json"]) == 0
    assert recorder.built[-1]["edge_model"] is None  # not overridden: the settings decide
    assert load_config(edge_model=recorder.built[-1]["edge_model"]).edge_model == "gemma3-270m"
    assert cli.main(["ask", "hi", "--json", "--model", "smollm2-135m-instruct"]) == 0
    assert recorder.built[-1]["edge_model"] == "smollm2-135m-instruct"


def test_sampling_flags_reach_the_request(recorder):
    assert (
        cli.main(
            [
                "ask",
                "hi",
                "--json",
                "--top-k",
                "5",
                "--min-p",
                "0.1",
                "--repeat-penalty",
                "1.2",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    asked = recorder.asked[-1]
    assert (asked["top_k"], asked["min_p"], asked["repeat_penalty"], asked["seed"]) == (5, 0.1, 1.2, 3)


def test_the_default_model_id_is_written_once():
    import pathlib

    import hybridllm

    root = pathlib.Path(hybridllm.__file__).parent
    # models/ is the catalog's own code (its messages name catalog ids as examples)
    hits = [
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if "smollm2-135m-instruct" in p.read_text() and p.parent.name != "models"
    ]
    assert hits == ["_config.py"], hits


def test_models_list_columns_line_up_for_long_ids(capsys):
    # the catalog's longest id (qwen2.5-coder-1.5b-instruct) is longer than the old fixed column
    assert cli.main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 5
    # where the second column (KIND) begins on each line: after the id and its padding
    cols = [len(line) - len(line[line.index(" ") :].lstrip()) for line in lines]
    assert len(set(cols)) == 1, lines


def test_threads_below_one_are_refused(recorder, capsys):
    """Before: --threads -3 (or n_threads=-3) went to llama.cpp as it was. Then it was refused with
    exit 1 and a message about n_threads; now, like every other bad option value, it is a usage
    error (exit 2) that names --threads, before anything is built."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["ask", "hi", "--json", "--threads", "-3"])
    assert exit_.value.code == 2
    assert "argument --threads" in capsys.readouterr().err and recorder.built == []


@pytest.mark.parametrize("action", ["stats", "clear"])
def test_cache_commands_on_a_missing_path_say_so_and_create_nothing(tmp_path, capsys, action):
    """Before: a mistyped --path made a new empty cache there (folders included) and reported
    '0 entries' / 'removed 0 entries'; a folder given as --path was moved aside as 'corrupt'."""
    missing = tmp_path / "typo" / "cache.sqlite3"
    assert cli.main(["cache", action, "--path", str(missing)]) == 1
    assert "no cache database" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert cli.main(["cache", action, "--path", str(tmp_path)]) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags", [["--port", "99999"], ["--port", "-1"], ["--max-body-bytes", "-1"],
                                   ["--log-level", "loud"], ["--shutdown-timeout", "-1"],
                                   ["--shutdown-timeout", "nan"]])
def test_serve_refuses_bad_values_as_usage_errors(flags, capsys):
    """Before: --port 99999 loaded the model and then hung; --max-body-bytes -1 answered every
    request 413; --log-level loud loaded the model, then died with 'internal error: KeyError'."""
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["serve", *flags])
    assert exit_.value.code == 2 and flags[0] in capsys.readouterr().err


def test_serve_on_a_busy_port_says_so_before_loading_the_model(monkeypatch, capsys):
    """Before: the model loaded, the banner claimed the address, then uvicorn exited with status 3."""
    import socket

    pytest.importorskip("uvicorn")

    def no_model(**kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("hybridllm._client.HybridLLM", no_model)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", "--port", str(port), "--no-cache"]) == 1
    assert f"Cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"hybridllm = 5\n", b"\xff\xfe", None])
def test_config_files_that_cannot_be_read_are_one_line_errors(tmp_path, capsys, content):
    """Before: a non-table [hybridllm], a file that is not UTF-8 and a folder given as --config
    gave 'internal error: TypeError / UnicodeDecodeError / IsADirectoryError'."""
    path = tmp_path / "config.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert cli.main(["config", "show", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "internal error" not in err and str(path) in err


@pytest.mark.parametrize(("content", "problem"), [
    ("temperature = 9", "temperature must be between 0 and 2, got 9"),
    ("top_p = 0", "top_p must be in (0, 1], got 0"),
    ("[hybridllm]\nmax_tokens = -1", "max_tokens must be at least 1, got -1"),
    ("cloud_url = 5", "cloud_url must be a string or a list of strings, got 5"),
    ("cache = 1", "cache must be true or false, got 1"),
])
def test_bad_values_in_a_config_file_fail_at_load_naming_the_file(tmp_path, capsys, content, problem):
    """Before: sampling defaults out of range were shown by `config show` and failed only at the
    first request, as an InvalidRequestError without the file; cloud_url = 5 gave "Invalid
    settings: 'int' object is not iterable"."""
    path = tmp_path / "config.toml"
    path.write_text(content + "\n")
    assert cli.main(["config", "show", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: Config file {path}: {problem}"), err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("flags", "problem"), [
    (["--temperature", "5"], "temperature must be between 0 and 2, got 5.0"),
    (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
    (["--max-tokens", "-1"], "max_tokens must be at least 1, got -1"),
    (["--repeat-penalty", "0"], "repeat_penalty must be in (0, 10]"),
])
def test_bad_sampling_options_are_usage_errors_before_anything_loads(monkeypatch, capsys, flags, problem):
    """Before: `hybridllm ask --temperature 5 hi` copied and loaded the model, then refused."""
    def no_model(**kw):
        raise AssertionError("the client was built")

    monkeypatch.setattr("hybridllm._client.HybridLLM", no_model)
    for command in (["ask", *flags, "hi"], ["chat", *flags]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(command)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flags[0]}: {problem}" in err, err
    stops = [arg for i in range(5) for arg in ("--stop", f"s{i}")]
    assert cli.main(["ask", *stops, "hi"]) == 2  # the options together: checked before loading too
    assert "argument --stop: at most 4 stop strings" in capsys.readouterr().err


# --- chat and ask: the terminal, pipes, Ctrl-C, the context window -------------------------------


class FakeEdge:
    model = "fake-edge"

    def __init__(self, context_length=4096):
        self.context_length = context_length

    def tokenize(self, messages):
        return [0] * sum(len(m["content"].split()) + 4 for m in messages)


class FakeStream:
    def __init__(self, pieces, interrupt_after=None):
        self.pieces, self.interrupt_after, self.completion = pieces, interrupt_after, None

    def __iter__(self):
        from hybridllm import Chunk, Completion

        for i, piece in enumerate(self.pieces):
            if i == self.interrupt_after:
                raise KeyboardInterrupt
            yield Chunk(text=piece, route="edge", model="fake")
        self.completion = Completion(text="".join(self.pieces), route="edge", reason="why", model="fake")


class ChatFake:
    """Stands in for HybridLLM in chat/ask: records each conversation it was sent."""

    sent: list = []
    answers: list = []
    edge = FakeEdge()

    def __init__(self, **kw):
        from types import SimpleNamespace

        self.cloud = None
        self.config = SimpleNamespace(max_tokens=256)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def stream(self, messages, **params):
        from hybridllm import InvalidRequestError

        ChatFake.sent.append(messages if isinstance(messages, str) else [dict(m) for m in messages])
        answer = ChatFake.answers.pop(0) if ChatFake.answers else FakeStream(["an ", "answer"])
        if isinstance(answer, Exception):
            raise answer
        assert not isinstance(answer, InvalidRequestError)
        return answer

    def chat(self, messages, **params):
        from hybridllm import Completion

        ChatFake.sent.append(messages)
        return Completion(text='say "hi"\n\u00e9\U0001f600', route="edge", reason="r", model="m")


class Terminal:
    """A stand-in stream that says it is a terminal (or not)."""

    def __init__(self, tty, lines=()):
        import io

        self.tty, self.buffer = tty, io.StringIO("".join(f"{line}\n" for line in lines))

    def isatty(self):
        return self.tty

    def readline(self):
        return self.buffer.readline()

    def read(self):
        return self.buffer.read()

    def write(self, text):
        return len(text)  # what a terminal shows is not checked here

    def flush(self):
        pass


@pytest.fixture
def fake(monkeypatch):
    ChatFake.sent, ChatFake.answers, ChatFake.edge = [], [], FakeEdge()
    monkeypatch.setattr("hybridllm._client.HybridLLM", ChatFake)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    return ChatFake


def scripted_input(monkeypatch, script):
    """Makes input() return each line of script in turn (an exception in it is raised); EOF after."""
    lines = list(script)

    def fake_input(prompt=""):
        if not lines:
            raise EOFError
        line = lines.pop(0)
        if isinstance(line, BaseException):
            raise line
        return line

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr("sys.stdin", Terminal(True))


def test_piped_chat_writes_only_answers_to_stdout(fake, monkeypatch, capsys):
    """Before: `echo q | hybridllm chat > out` wrote the banner, 'you> ' prompts and the trace
    line into out, between the answers."""
    monkeypatch.setattr("sys.stdin", Terminal(False, ["first question", "second question"]))
    assert cli.main(["chat"]) == 0
    out, err = capsys.readouterr()
    assert out == "an answer\nan answer\n"
    assert "[edge · fake · TTFT - · - tok/s · 0 tokens · why]" in err and "\x1b[" not in err
    assert [m["content"] for m in fake.sent[-1]] == ["first question", "an answer", "second question"]


def test_piped_chat_that_failed_exits_1(fake, monkeypatch, capsys):
    from hybridllm import EdgeError

    fake.answers = [EdgeError("the model broke")]
    monkeypatch.setattr("sys.stdin", Terminal(False, ["q", "q again"]))
    assert cli.main(["chat"]) == 1
    out, err = capsys.readouterr()
    assert "error: the model broke" in err and out.endswith("an answer\n")
    assert [m["content"] for m in fake.sent[-1]] == ["q again"]  # the failed turn left no trace


def test_status_lines_follow_their_own_stream_and_no_color(fake, monkeypatch, capsys):
    """Before: the colour of stderr's trace line was decided by whether stdout was a terminal, and
    NO_COLOR was ignored."""
    assert _cli_terminal._style("x", "2", Terminal(True)) == "\x1b[2mx\x1b[0m"
    assert _cli_terminal._style("x", "2", Terminal(False)) == "x"
    monkeypatch.setenv("NO_COLOR", "1")
    assert _cli_terminal._style("x", "2", Terminal(True)) == "x"
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr("sys.stdout", Terminal(True))  # stdout a terminal, stderr captured
    _cli_terminal._note("status")
    assert capsys.readouterr().err == "status\n"


def test_unknown_slash_commands_are_not_sent_to_the_model(fake, monkeypatch, capsys):
    """Before: a mistyped /rest went to the model as a question."""
    scripted_input(monkeypatch, ["/rest", "/usr/bin holds what?", "/HELP"])
    assert cli.main(["chat"]) == 0
    out, err = capsys.readouterr()
    assert "unknown command /rest" in err
    assert len(fake.sent) == 1 and fake.sent[0][-1]["content"] == "/usr/bin holds what?"
    assert _chat_cli.CHAT_HELP in err and _chat_cli.CHAT_HELP not in out  # stdout is no terminal


def test_ctrl_c_stops_the_answer_and_keeps_what_was_shown(fake, monkeypatch, capsys):
    """Ctrl-C mid-answer keeps the session; the question and the part of the answer on the screen
    stay in the conversation (before: both were dropped, unannounced)."""
    fake.answers = [FakeStream(["Once ", "upon ", "a time"], interrupt_after=2),
                    FakeStream(["never"], interrupt_after=0)]
    scripted_input(monkeypatch, ["tell a story", "stop at once", "go on"])
    assert cli.main(["chat"]) == 0
    err = capsys.readouterr().err
    assert "partial answer stays" in err and "the question is not kept" in err
    assert fake.sent[-1] == [{"role": "user", "content": "tell a story"},
                             {"role": "assistant", "content": "Once upon "},
                             {"role": "user", "content": "go on"}]


def test_ctrl_c_at_the_prompt_asks_for_a_second_one(fake, monkeypatch, capsys):
    """Before: one Ctrl-C at the prompt (to clear a half-typed line) ended the whole conversation."""
    scripted_input(monkeypatch, [KeyboardInterrupt(), "question", KeyboardInterrupt(), KeyboardInterrupt()])
    assert cli.main(["chat"]) == 130
    assert "press Ctrl-C again" in capsys.readouterr().err
    assert len(fake.sent) == 1


def test_a_conversation_past_the_context_drops_its_oldest_turns(fake, monkeypatch, capsys):
    """Before: the turn that no longer fitted failed ("The prompt is N tokens ...") and so did every
    turn after it; the one before had its answer cut silently by the full context."""
    fake.edge = FakeEdge(context_length=80)
    words = " ".join(["word"] * 10)
    scripted_input(monkeypatch, [f"q{i} {words}" for i in range(6)])
    assert cli.main(["chat", "--system", "be brief", "--max-tokens", "20"]) == 0
    assert len(fake.sent) == 6
    for sent in fake.sent:
        assert len(fake.edge.tokenize(sent)) + 20 <= 80
        assert sent[0] == {"role": "system", "content": "be brief"}
    assert [m["content"].split()[0] for m in fake.sent[-1][1:]] == ["q4", "an", "q5"]
    assert "dropped its 2 oldest messages" in capsys.readouterr().err


def test_text_that_is_not_utf8_is_replaced_not_refused(fake, monkeypatch, capsys):
    """Before: `hybridllm ask $'caf\\xe9'` (Latin-1 bytes) failed with 'holds a lone UTF-16
    surrogate ... half of an emoji'."""
    assert cli.main(["ask", "caf\udce9 au lait"]) == 0
    assert fake.sent[-1] == "caf\ufffd au lait"
    assert _cli_terminal._text("\ud83d!") == "?!"


def test_ask_reads_stdin_and_takes_system(fake, monkeypatch, capsys):
    """Before: `echo q | hybridllm ask` and `hybridllm ask q --system S` were usage errors."""
    monkeypatch.setattr("sys.stdin", Terminal(False, ["what is", "this?"]))
    assert cli.main(["ask", "--system", "be brief"]) == 0
    assert fake.sent[-1] == [{"role": "system", "content": "be brief"},
                             {"role": "user", "content": "what is\nthis?"}]
    assert capsys.readouterr().out == "an answer\n"
    monkeypatch.setattr("sys.stdin", Terminal(True))
    assert cli.main(["ask"]) == 2
    assert "ask needs a prompt" in capsys.readouterr().err


def test_an_empty_prompt_is_a_usage_error_before_the_models_load(fake, monkeypatch, capsys):
    """Before: `hybridllm ask ""` built the client (loading the models) and failed in it, exit 1;
    an empty stdin was already a usage error, exit 2."""
    def no_client(*a, **k):
        raise AssertionError("the client was built for an empty prompt")

    monkeypatch.setattr("hybridllm._client.HybridLLM", no_client)
    for prompt in ("", "  \n "):
        assert cli.main(["ask", prompt]) == 2
        assert "the prompt is empty" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", Terminal(False, ["  "]))
    assert cli.main(["ask"]) == 2
    assert "the prompt read from stdin is empty" in capsys.readouterr().err
    assert fake.sent == []


def test_ask_json_is_one_parseable_object(fake, capsys):
    import json

    assert cli.main(["ask", "hi", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out)["text"] == 'say "hi"\n\u00e9\U0001f600'


def test_the_interactive_prompt_has_line_editing(fake, monkeypatch, capsys):
    """Before: readline was never loaded, so the arrow keys printed ^[[A instead of recalling a line,
    and the prompt's colour codes were not marked for it (long lines wrapped in the wrong place)."""
    import sys

    pytest.importorskip("readline")
    monkeypatch.delitem(sys.modules, "readline", raising=False)
    prompts = []

    def fake_input(prompt=""):
        prompts.append(prompt)
        raise EOFError

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr("sys.stdin", Terminal(True))
    monkeypatch.setattr("sys.stdout", Terminal(True))
    assert cli.main(["chat"]) == 0
    assert "readline" in sys.modules
    assert prompts == ["\x01\x1b[1m\x02you> \x01\x1b[0m\x02"]
