"""The conformance suite as tests of your own repository: one test per clause of the paper, each failing with
the suite's diagnostic (docs/ci.md). With pytest-xdist, keep each implementation's clauses on one worker:

    python3 -m pytest test_paper_conformance.py -n auto --dist loadgroup
"""

from pathlib import Path

from aiayn_conformance.checks import parametrize_with_checks

PLUGIN = str(Path(__file__).with_name("my_plugin.py"))


@parametrize_with_checks("mine", plugins=[PLUGIN])
def test_paper_conformance(check):
    check()
