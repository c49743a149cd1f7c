"""One error style for every command: ``error: <option>: <what is wrong>`` on one line of stderr.

Exit status 2 for bad input (click's usage errors and :class:`InputError`), 1 when a command could not run here (no
GPU, a compile failure), 130 when interrupted. Core functions raise ``ValueError("<python_arg>: ...")``;
:func:`bad_value` rewrites the argument name to the option as a user types it (``tp_size`` -> ``--tp-size``).
"""
from __future__ import annotations

import re
from typing import NoReturn

import click

INPUT_ERROR = 2
RUN_ERROR = 1
INTERRUPTED = 130


class InputError(click.ClickException):
    """Bad input: printed as one ``error:`` line, exit status 2."""

    exit_code = INPUT_ERROR


class RunError(click.ClickException):
    """The command could not run here (missing GPU or tool): one ``error:`` line, exit status 1."""

    exit_code = RUN_ERROR


class Interrupted(click.ClickException):
    """Stopped by the user (Ctrl-C) after saving what was done: exit status 130."""

    exit_code = INTERRUPTED


def fail(message: str) -> NoReturn:
    """Stop with one error line and exit status 2."""
    raise InputError(message)


def option_name(param: click.Parameter) -> str:
    """How a user types ``param``: its first long option (``--tp-size``), else its first option, else the argument's
    metavar without an ellipsis (``MODEL``)."""
    if isinstance(param, click.Option):
        longs = [o for o in param.opts if o.startswith("--")]
        return (longs or param.opts)[0]
    return (param.metavar or param.name.upper()).rstrip(".")


def _option_for(python_name: str) -> str | None:
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        for param in ctx.command.params:
            if param.name in (python_name, python_name + "s"):  # a list option reports one bad item
                return option_name(param)
        ctx = ctx.parent
    return None


def user_message(message: str) -> str:
    """``message`` with a leading ``python_arg:`` replaced by the option of the running command that sets it."""
    m = re.match(r"(\w+): (.*)", message, re.DOTALL)
    if m and (opt := _option_for(m.group(1))):
        return f"{opt}: {m.group(2)}"
    return message


def bad_value(exc: ValueError) -> NoReturn:
    """Stop with the ValueError's message (argument name translated to the option) and exit status 2."""
    raise InputError(user_message(str(exc))) from None


def usage_line(exc: click.UsageError) -> str:
    """One line for a click usage error, naming the option as typed."""
    if isinstance(exc, click.MissingParameter) and exc.param is not None:
        return f"{option_name(exc.param)}: missing (required)"
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        return f"{option_name(exc.param)}: {exc.message}"
    return exc.format_message()


def one_line(text: str) -> str:
    return " ".join(text.split())
