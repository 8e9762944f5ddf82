"""Discovery: built-ins, entry points, AIAYN_PLUGINS, --plugin; one clear line per broken discovered plugin,
a usage error for a broken explicit one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from registered import PLUGINS, builtin_module

from aiayn_conformance.implementations import (
    Implementation,
    PluginError,
    Registry,
    UnknownImplementationError,
    validated,
)
from aiayn_conformance.implementations.registry import own_entry_points
from aiayn_conformance.reference.model import Transformer

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


REFERENCE_PLUGIN = builtin_module("reference")


def isolated(*extra, env=None, strict=False, builtins=(REFERENCE_PLUGIN,)):
    """A registry of the given built-ins and explicit plugins (``--plugin``), with no entry points."""
    return Registry(extra, builtins=builtins, entry_points=False, env=env or {}, strict=strict).load()


def discovered(*paths, strict=False):
    """A registry whose extra plugins are discovered (``AIAYN_PLUGINS``), not named explicitly."""
    return isolated(env={"AIAYN_PLUGINS": ",".join(str(p) for p in paths)}, strict=strict)


def test_reference_is_registered_first():
    reg = isolated()
    assert reg.names() == ["reference"] and reg.errors == []
    impl = reg.get("reference")
    assert impl.output == "logits" and impl.plugin == builtin_module("reference") and not impl.deviations
    every = Registry(entry_points=False, env={}).load()
    assert every.errors == [] and every.names()[0] == "reference"
    # Registration order is PLUGINS' order (each built-in module registers its implementations in turn), then the
    # project's own entry points: the built-ins that live above the registry's layer.
    order = [builtin_module(m) for m in PLUGINS] + [ep.name for ep in own_entry_points()]
    plugins = [every.get(n).plugin for n in every.names()]
    assert plugins == sorted(plugins, key=order.index), plugins
    assert "onnxruntime-cached" in every.names() and every.get("onnxruntime-cached").plugin == "onnxruntime-cached"
    assert {c.plugin for c in every.components.values()} <= set(order)


def test_plugins_register_in_load_order_each_under_its_own_name():
    """Built-ins in their listed order, then AIAYN_PLUGINS, then --plugin; each registration names its plugin."""
    good, exiting = str(FIXTURES / "good_plugin.py"), str(FIXTURES / "exiting_plugin.py")
    builtins = tuple(builtin_module(m) for m in ("fused", "reference", "torch_nn"))
    reg = isolated(exiting, env={"AIAYN_PLUGINS": good}, builtins=builtins)
    assert reg.names() == ["fused", "reference", "torch-nn", "file-plugin-model", "hard-exit"]
    assert [reg.get(n).plugin for n in reg.names()] == [*builtins, good, exiting]
    assert reg.errors == []


def test_loading_is_idempotent():
    reg = isolated()
    assert reg.load() is reg and reg.names() == ["reference"]


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownImplementationError, match="unknown implementation 'nope'; known: reference"):
        isolated().get("nope")


def test_unknown_name_names_the_plugins_that_failed_to_load():
    """The name asked for may be one the broken plugin would have registered: the error says why it is missing."""
    reg = discovered(FIXTURES / "broken_import_plugin.py")
    with pytest.raises(UnknownImplementationError) as info:
        reg.select("mine")
    message = str(info.value)
    assert message.startswith("unknown implementation 'mine'; known: reference; 1 plugin(s) failed to load: ")
    assert "broken_import_plugin.py" in message and "ModuleNotFoundError" in message and "\n" not in message
    assert "failed to load" not in str(UnknownImplementationError("x", ["reference"]))


def test_selection():
    reg = isolated(str(FIXTURES / "good_plugin.py"))
    assert [i.name for i in reg.select("all")] == ["reference", "file-plugin-model"]
    assert [i.name for i in reg.select("file-plugin-model, reference")] == ["file-plugin-model", "reference"]
    with pytest.raises(UnknownImplementationError):
        reg.select("reference,nope")


def test_plugin_from_a_py_path_and_from_the_environment():
    by_arg = isolated(str(FIXTURES / "good_plugin.py"))
    by_env = isolated(env={"AIAYN_PLUGINS": f"{FIXTURES / 'good_plugin.py'}"})
    for reg in (by_arg, by_env):
        assert "file-plugin-model" in reg.names() and reg.errors == []


def test_plugin_by_module_name(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    reg = isolated("good_plugin")
    assert "file-plugin-model" in reg.names()


def test_import_failure_is_one_line_naming_the_plugin_and_others_still_load():
    reg = discovered(FIXTURES / "broken_import_plugin.py", FIXTURES / "good_plugin.py")
    assert "file-plugin-model" in reg.names()
    assert len(reg.errors) == 1
    (err,) = reg.errors
    assert "broken_import_plugin.py" in err and "ModuleNotFoundError" in err and "\n" not in err


def test_missing_plugin_file():
    reg = discovered("/nonexistent/plugin.py")
    assert len(reg.errors) == 1 and "no such plugin file" in reg.errors[0]


def test_invalid_registrations_are_rejected_one_by_one():
    reg = discovered(FIXTURES / "bad_registrations_plugin.py")
    assert reg.names() == ["reference", "fine-one"]
    text = "\n".join(reg.errors)
    assert len(reg.errors) == 3
    assert f"already registered by plugin '{builtin_module('reference')}'" in text
    assert "unknown clause 'attention.scaling'" in text
    assert "output 'softmax' is not one of logits, log_probs, probs" in text


def test_a_raising_hook_is_reported_and_others_still_load():
    reg = discovered(FIXTURES / "raising_plugin.py")
    assert reg.names() == ["reference"]
    assert any("raised in register_implementations: RuntimeError: boom in the plugin" in e for e in reg.errors)


def test_misspelled_hook_is_reported():
    reg = discovered(FIXTURES / "misspelled_hook_plugin.py")
    assert any("unknown hook" in e and "register_implementation" in e for e in reg.errors)


def test_strict_mode_raises():
    with pytest.raises(PluginError, match="failed to import"):
        discovered(FIXTURES / "broken_import_plugin.py", strict=True)


@pytest.mark.parametrize("plugin, message", [
    ("/nonexistent/plugin.py", "failed to import: FileNotFoundError: no such plugin file"),
    (str(FIXTURES / "broken_import_plugin.py"), "failed to import: ModuleNotFoundError"),
    (str(FIXTURES / "raising_plugin.py"), "raised in register_implementations: RuntimeError: boom in the plugin"),
    (str(FIXTURES / "bad_registrations_plugin.py"), f"already registered by plugin '{builtin_module('reference')}'"),
    (str(FIXTURES / "misspelled_hook_plugin.py"), "unknown hook: register_implementation "),
])
def test_an_explicit_plugin_that_fails_is_an_error_naming_it(plugin, message):
    """A plugin the user named (--plugin) is an instruction: any failure raises, in one line naming it."""
    with pytest.raises(PluginError) as info:
        isolated(plugin)
    text = str(info.value)
    assert text.startswith(f"plugin {plugin!r}") and message in text and "\n" not in text


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "all"}, "reserved"),
    ({"name": "has space"}, "invalid"),
    ({"name": "a,b"}, "invalid"),
    ({"build": 3}, "callable"),
    ({"deviations": {"mask.causal": ""}}, "needs a reason"),
])
def test_implementation_validation(kwargs, message):
    fields = {"name": "x", "build": Transformer, **kwargs}
    with pytest.raises(ValueError, match=message):
        validated(Implementation(**fields))


def test_deviations_are_read_only():
    impl = validated(Implementation(name="x", build=Transformer, deviations={"norm.post-norm": "pre-norm"}))
    with pytest.raises(TypeError):
        impl.deviations["mask.causal"] = "no"  # type: ignore[index]


def run(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "AIAYN_PLUGINS"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_aiayn_list_shows_a_file_plugin_given_by_env():
    res = run("-m", "aiayn_conformance", "list", env_extra={"AIAYN_PLUGINS": str(FIXTURES / "good_plugin.py")})
    assert res.returncode == 0, res.stderr
    assert "reference" in res.stdout and "file-plugin-model" in res.stdout


def test_aiayn_list_json_and_plugin_option():
    import json

    res = run("-m", "aiayn_conformance", "list", "--json", "--plugin", str(FIXTURES / "good_plugin.py"))
    assert res.returncode == 0, res.stderr
    names = [i["name"] for i in json.loads(res.stdout)["implementations"]]
    assert names[0] == "reference" and "file-plugin-model" in names


def test_aiayn_list_reports_a_broken_plugin_on_stderr_and_still_lists():
    res = run("-m", "aiayn_conformance", "list", env_extra={"AIAYN_PLUGINS": str(FIXTURES / "broken_import_plugin.py")})
    assert res.returncode == 0
    assert "reference" in res.stdout
    assert "plugin error" in res.stderr and "broken_import_plugin.py" in res.stderr


def test_suite_audits_a_file_plugin_with_the_plugin_option():
    res = run("-m", "pytest", "conformance/test_model.py", "--clause=model.shape",
              f"--plugin={FIXTURES / 'good_plugin.py'}", "--impl=file-plugin-model", "-v", "-p", "no:cacheprovider")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "implementation under test: file-plugin-model" in res.stdout  # the report header
    assert "test_shape_witness[file-plugin-model] PASSED" in res.stdout


def test_suite_audits_a_file_plugin_given_by_env():
    res = run("-m", "pytest", "conformance/test_model.py", "--clause=model.shape", "--impl=file-plugin-model", "-q",
              "-p", "no:cacheprovider", env_extra={"AIAYN_PLUGINS": str(FIXTURES / "good_plugin.py")})
    assert res.returncode == 0, res.stdout + res.stderr


def test_suite_rejects_an_unknown_name_at_once_with_the_known_ones():
    res = run("-m", "pytest", "conformance/", "--impl=nope", "-q", "-p", "no:cacheprovider")
    assert res.returncode == 4
    assert "unknown implementation 'nope'; known:" in res.stderr and "reference" in res.stderr


@pytest.mark.parametrize("command", [
    ["-m", "aiayn_conformance", "audit", "--impl", "reference"],
    ["-m", "aiayn_conformance", "list"],
    ["-m", "aiayn_conformance", "export", "--impl", "reference", "--preset", "tiny", "--out", "never-written.onnx"],
])
def test_aiayn_stops_on_an_explicit_plugin_it_cannot_load(command):
    res = run(*command, "--plugin", "does-not-exist.py")
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "'does-not-exist.py' (--plugin) failed to import" in lines[0], res.stderr
    assert "no such plugin file" in lines[0] and "Traceback" not in res.stderr


def test_suite_stops_on_an_explicit_plugin_it_cannot_load():
    res = run("-m", "pytest", "conformance/", "--plugin", "does-not-exist.py", "--impl=reference", "-q",
              "-p", "no:cacheprovider")
    assert res.returncode == 4, res.stdout + res.stderr  # pytest's usage-error exit status
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "plugin 'does-not-exist.py' (--plugin) failed to import" in errors[0], \
        res.stderr
    assert "collected" not in res.stdout and "passed" not in res.stdout
