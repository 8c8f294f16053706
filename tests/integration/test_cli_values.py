"""Every typed option of the command lines, given a value of the wrong form, is refused with
the option's name, the value given and the form expected (never argparse's `invalid
_positive_int value`)."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from server.cli.main import build_parser
from server.loadtest.cli import build_parser as loadtest_parser
from tests.integration.test_cli_errors import chorus, short_failure


def _typed_options(parser: argparse.ArgumentParser, *prefix: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _typed_options(sub, *prefix, name)
        elif action.option_strings and callable(action.type) and action.choices is None:
            yield prefix, action


def _refusal(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        parser.parse_args(argv)
    return err.getvalue()


@pytest.mark.parametrize("make_parser", [build_parser, loadtest_parser])
def test_every_typed_option_names_itself_and_the_expected_form(make_parser):
    seen = 0
    for prefix, action in _typed_options(make_parser()):
        if action.type is str.lower:
            continue
        option = action.option_strings[0]
        message = _refusal(make_parser(), [*prefix, option, "abc"])
        assert f"argument {option}: 'abc' is not a" in message and "(expected " in message, message
        assert "invalid" not in message, message
        seen += 1
    assert seen >= 6


def test_out_of_range_values_say_the_range():
    parser = build_parser
    assert "0 is not positive (expected a positive integer" in _refusal(parser(), ["serve", "--max-queue", "0"])
    assert "'12Q' is not a size (expected a size in bytes, e.g. 1048576, 512K" in _refusal(
        parser(), ["serve", "--max-reference-bytes", "12Q"])
    assert "'nan' is not a number" in _refusal(parser(), ["serve", "--max-audio-seconds", "nan"])
    assert "1.5 is out of range (expected a share 0..1" in _refusal(loadtest_parser(), ["--cancel-rate", "1.5"])


def test_the_command_line_as_a_user_meets_it():
    short_failure(chorus("serve", "--max-queue", "abc"),
                  "argument --max-queue: 'abc' is not a whole number (expected a positive integer, e.g. 16)")
