"""The `hybridllm` command's parsers: whole option names only, usage errors on one line, and every
option's default in its --help. Before: argparse took `--cloud` for `serve --cloud-url` and
`--fold` for `router train --folds` (a shorthand in a script changes meaning once an option sharing
the prefix is added); an unknown option printed the whole usage block, then an error naming
`hybridllm` instead of the subcommand; and `router label --help` did not say that --max-tokens is
256, --concurrency 8 or --timeout 900 (nor `router train --help` its model's defaults)."""

from __future__ import annotations

import argparse

import pytest

from hybridllm import cli

ABBREVIATED = [
    (["serve", "--cloud", "http://localhost:8000/v1"], "hybridllm serve", "--cloud"),
    (["router", "train", "--data", "f.csv", "--out", "o", "--fold", "3"], "hybridllm router train", "--fold"),
    (["router", "calibrate", "--prompts", "p.txt", "--cloud-frac", "0.3"], "hybridllm router calibrate",
     "--cloud-frac"),
    (["router", "label", "--data", "q", "--edge", "e", "--cloud", "u", "--cloud-m", "m"],
     "hybridllm router label", "--cloud-m"),
    (["cache", "stats", "--pa", "x.sqlite3"], "hybridllm cache stats", "--pa"),
    (["ask", "hi", "--temp", "0"], "hybridllm ask", "--temp"),
    (["models", "prepare", "minilm-l6-v2", "--prec", "int8"], "hybridllm models prepare", "--prec"),
    (["config", "show", "--conf", "x.toml"], "hybridllm config show", "--conf"),
]


@pytest.mark.parametrize(("argv", "prog", "option"), ABBREVIATED)
def test_an_abbreviated_option_is_a_one_line_usage_error_of_its_subcommand(capsys, argv, prog, option):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{prog}: error: unrecognized arguments: {option}"), lines[0]
    assert lines[0].endswith(f"(see {prog} --help)"), lines[0]


def test_main_refuses_an_abbreviation_before_running_anything(monkeypatch, capsys):
    monkeypatch.setattr("hybridllm._serve_cli.cmd_serve", lambda args: pytest.fail("it ran"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--cloud", "http://localhost:8000/v1"])
    assert exit_.value.code == 2 and len(capsys.readouterr().err.splitlines()) == 1


def test_whole_options_and_the_equals_form_still_parse():
    args = cli.build_parser().parse_args(["serve", "--cloud-url=http://a/v1", "--cloud-url", "http://b/v1"])
    assert args.cloud_url == ["http://a/v1", "http://b/v1"]
    args = cli.build_parser().parse_args(["router", "train", "--data", "f.csv", "--out", "o", "--folds", "3"])
    assert args.folds == 3


@pytest.mark.parametrize(
    "argv",
    [["bogus"], ["router", "train", "--data", "f.csv", "--out", "o", "--folds", "x"], ["models"],
     ["models", "pull", "a", "b"]],
)
def test_other_usage_errors_are_one_line_too(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and ": error: " in err, err


# --help states the defaults ------------------------------------------------------------------------
def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
    for action in subs:
        for name, sub in action.choices.items():
            if name not in ("rm",):  # an alias: the same parser as `remove`
                yield from _leaves(sub, (*words, name))


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_every_option_with_a_default_says_it_in_its_help():
    """Router, cache, models, chat and ask (serve and config show are another part's parsers)."""
    missing = []
    for words, leaf in _leaves(cli.build_parser()):
        if words[0] in ("serve", "config"):
            continue
        for action in leaf._actions:
            value = action.default
            if not action.option_strings or value in (None, False, [], argparse.SUPPRESS):
                continue
            help_text = action.help or ""
            stated = help_text[help_text.find("default"):] if "default" in help_text else ""
            if _shown(value) not in stated:
                missing.append(f"hybridllm {' '.join(words)} {action.option_strings[0]}: {help_text!r}")
    assert len(missing) == 0, "\n".join(missing)


def test_router_train_states_the_models_defaults():
    """--c, --k, --mix, --topics and --topic-mix default to None (train.Hyper's values then): the
    help states those values, and they are the ones training uses."""
    from hybridllm.router.train import Hyper

    train = {a.dest: a for a in _leaf(("router", "train"))._actions}
    for name in ("c", "k", "mix", "topics", "topic_mix"):
        assert f"(default: {getattr(Hyper(), name):g})" in train[name].help, train[name].help
    assert "(default: 5)" in train["folds"].help and train["folds"].default == 5


def _leaf(words: tuple[str, ...]) -> argparse.ArgumentParser:
    return dict(_leaves(cli.build_parser()))[words]


def test_every_router_option_that_is_not_required_or_a_switch_says_its_default():
    """Also those whose default is None: what happens when the option is left out."""
    bare = []
    for words, leaf in _leaves(cli.build_parser()):
        if words[0] != "router":
            continue
        for action in leaf._actions:
            if action.option_strings and not action.required and action.nargs != 0:
                if "default" not in (action.help or ""):
                    bare.append(f"{' '.join(words)} {action.option_strings[0]}")
    assert bare == [], bare
