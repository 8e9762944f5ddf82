"""``aiayn install``'s command parsing (aiayn_conformance/commands/install.py): ``&&``-joined steps, ``pip`` run as
this interpreter's, a leading ``VAR=value`` set in that step's environment only, and a step that only assigns refused
in one line."""

from __future__ import annotations

import sys

import pytest

from aiayn_conformance.commands.install import steps


def test_pip_steps_run_with_this_interpreter():
    assert steps("pip install a && python3 -m pip install b") == [
        ({}, [sys.executable, "-m", "pip", "install", "a"]), ({}, [sys.executable, "-m", "pip", "install", "b"])]


def test_leading_assignments_set_that_steps_environment_only():
    parsed = steps("pip install a && READTHEDOCS=1 X='two words' pip install --no-deps b")
    assert parsed == [({}, [sys.executable, "-m", "pip", "install", "a"]),
                      ({"READTHEDOCS": "1", "X": "two words"},
                       [sys.executable, "-m", "pip", "install", "--no-deps", "b"])]


def test_an_assignment_after_the_command_is_an_argument():
    assert steps("pip install A=1") == [({}, [sys.executable, "-m", "pip", "install", "A=1"])]


def test_a_step_that_only_assigns_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^`READTHEDOCS=1` sets READTHEDOCS but runs nothing; accepted: VAR=value "
                                         r"before a command$"):
        steps("pip install a && READTHEDOCS=1")
