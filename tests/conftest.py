"""The project's own tests under pytest-xdist (the README's test command: ``-n auto --dist loadgroup``).

Each test module's tests go to one worker, so a module-scoped fixture (a whole suite run in a subprocess, an audit,
an export) is made once, not once per worker; a test that names its own ``xdist_group`` (tests/test_broken_models.py
gives each of its suite runs one) keeps it. Without xdist, or without ``--dist loadgroup``, nothing changes.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None and item.nodeid.startswith("tests/"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
