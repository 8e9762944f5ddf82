"""The suite's command-line options, what they select, and the session's settings built from them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from aiayn_conformance.spec.clauses import parse_clause_ids

from .settings import AuditSettings

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Component, Implementation, Registry

__all__ = ["DEFAULT_TIMEOUT", "SETTINGS", "add_options", "audit_settings", "components_only", "registry",
           "selected_clauses", "selected_components", "selected_implementations"]

DEFAULT_TIMEOUT = 120.0

IMPLS = pytest.StashKey["list[Implementation]"]()  # chosen by --impl
COMPONENTS = pytest.StashKey["list[Component]"]()  # chosen by --component
SETTINGS = pytest.StashKey[AuditSettings]()  # --config and --weights


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiayn", "aiayn-conformance")
    group.addoption("--impl", action="store", default=None, metavar="NAME",
                    help="implementation(s) to audit: a name, a comma-separated list, or 'all' "
                         "(default: reference). `aiayn list` shows the names.")
    group.addoption("--plugin", action="append", default=[], metavar="MODULE_OR_PATH",
                    help="load an extra aiayn plugin from a module name or a .py file (repeatable)")
    group.addoption("--component", action="store", default=None, metavar="NAME",
                    help="component(s) to audit alone: NAME (every kind), KIND:NAME, a comma list, or 'all'; "
                         "without --impl only the component checks run")
    group.addoption("--check-timeout", action="store", type=float, default=None, metavar="SECONDS",
                    help=f"time budget per check; a check past it is reported as an error of its clause "
                         f"(default {DEFAULT_TIMEOUT:g} up to the base model, in proportion to the parameters above "
                         "it; or $AIAYN_CHECK_TIMEOUT; 0 disables)")
    group.addoption("--clause", action="store", default=None, metavar="ID",
                    help="run only the tests of this clause (or a comma-separated list of clauses)")
    group.addoption("--config", action="store", default=None, metavar="SPEC",
                    help="audit at these sizes: key=value pairs (d_model=64,h=4,src_vocab=40), a .json or .toml "
                         "file, or a Hugging Face config.json or model directory (keys: ModelConfig's fields)")
    group.addoption("--weights", action="store", default=None, metavar="PATH",
                    help="run the checks on these trained weights (one --impl): a torch state_dict (.pt/.pth), a "
                         ".safetensors file, a Hugging Face model directory, or a toolkit's checkpoint; checks "
                         "that need the suite's own weights are skipped")
    group.addoption("--device", action="store", default="cpu", metavar="DEVICE",
                    help="where the models the checks build run: cpu (default), cuda or cuda:N; inputs and outputs "
                         "cross to the CPU at the adapter's methods, TF32 off")
    group.addoption("--results-json", action="store", default=None, metavar="PATH",
                    help="write the outcome of every test (subject, clause, diagnostic) to PATH as JSON "
                         "(what `aiayn audit` reads)")


def registry(config: pytest.Config) -> Registry:
    from aiayn_conformance.implementations import PluginError, get_registry

    try:
        return get_registry(config.getoption("--plugin") or ())
    except PluginError as exc:  # a plugin named with --plugin that cannot be loaded: a usage error
        raise pytest.UsageError(str(exc)) from None


def selected_implementations(config: pytest.Config) -> list[Implementation]:
    """The Implementations chosen by --impl (kept in the config's stash)."""
    if IMPLS in config.stash:
        return config.stash[IMPLS]
    from aiayn_conformance.implementations import UnknownNameError

    try:
        impls = registry(config).select(config.getoption("--impl") or "reference")
    except UnknownNameError as exc:
        raise pytest.UsageError(f"--impl: {exc}") from None
    config.stash[IMPLS] = impls
    return impls


def selected_components(config: pytest.Config) -> list[Component]:
    """The Components chosen by --component (kept in the config's stash); [] without the option."""
    if COMPONENTS in config.stash:
        return config.stash[COMPONENTS]
    selection = config.getoption("--component")
    comps: list[Component] = []
    if selection:
        from aiayn_conformance.implementations import UnknownNameError

        try:
            comps = registry(config).select_components(selection)
        except UnknownNameError as exc:
            raise pytest.UsageError(f"--component: {exc}") from None
    config.stash[COMPONENTS] = comps
    return comps


def components_only(config: pytest.Config) -> bool:
    """--component without --impl: only the component checks run."""
    return bool(config.getoption("--component")) and config.getoption("--impl") is None


def selected_clauses(config: pytest.Config) -> list[str] | None:
    value = config.getoption("--clause")
    if not value:
        return None
    try:
        return parse_clause_ids(value)
    except ValueError as exc:
        raise pytest.UsageError(f"--clause: {exc}") from None


def audit_settings(config: pytest.Config) -> AuditSettings:
    """The session's settings from --config and --weights (checked to fit the implementation before any check
    is collected); kept in the stash."""
    if SETTINGS in config.stash:
        return config.stash[SETTINGS]
    from .devices import device_problem
    from .user_config import ConfigError
    from .user_weights import WeightsError, fit_problem, resolve

    spec, path = config.getoption("--config"), config.getoption("--weights")
    device = config.getoption("--device") or "cpu"
    problem = device_problem(device)
    if problem:
        raise pytest.UsageError(problem)
    settings = AuditSettings(device=device)
    if spec or path:
        impls = [] if components_only(config) or not path else selected_implementations(config)
        try:
            new, weights, sizes = resolve(spec, path, settings.config, impls)
        except (ConfigError, WeightsError) as exc:
            raise pytest.UsageError(str(exc)) from None
        audit = new or settings.config
        header = f"audit configuration (sizes from {sizes}): {audit}"
        if weights is None:
            settings = AuditSettings(config=audit, header=header, device=device)
        else:
            problem = fit_problem(impls, audit, weights)
            if problem:
                raise pytest.UsageError(problem)
            if weights.build is not None:  # a toolkit's checkpoint: the model is built with its own options
                impls[0] = dataclasses.replace(impls[0], build=weights.build)
            header += f"; weights: {weights.path}" + (f" ({weights.describes})" if weights.describes else "")
            settings = AuditSettings(config=audit, weights=weights, weights_for=impls[0].name, header=header,
                                     device=device)
    config.stash[SETTINGS] = settings
    return settings
