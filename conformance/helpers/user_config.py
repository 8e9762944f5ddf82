"""``--config``: the sizes an audit runs at, given by the user (the suite's own are ``configs.CONFIG``).

Three forms, read by :func:`read_config`:

- ``key=value`` pairs, comma-separated: ``d_model=64,h=4,src_vocab=40``;
- a JSON (``.json``) or TOML (``.toml``) file of the same keys;
- a Hugging Face configuration: a model directory holding ``config.json``, or a ``config.json`` whose keys are
  the library's (it has ``model_type`` or ``architectures``), mapped by :data:`HF_KEYS`.

The keys are :class:`~aiayn_conformance.spec.config.ModelConfig`'s field names, plus the paper's symbols ``h``
(n_heads) and ``N`` (n_layers). A key not given keeps the suite's tiny value; with shared embeddings (the
default) the two vocabularies are one size, so giving one of ``src_vocab`` / ``tgt_vocab`` sets both.

The suite's witnesses put limits on the sizes (:data:`SUITE_NEEDS`; and a padding id other than the witnesses'
start symbol, 1): a configuration outside them is refused with the reason, never audited in part. Every error
is one line (:class:`ConfigError`), naming what was wrong and what is accepted.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from aiayn_conformance.spec.config import PRESETS, ModelConfig
from aiayn_conformance.spec.decoding import TRANSLATION

__all__ = ["ALIASES", "ConfigError", "HF_KEYS", "SUITE_NEEDS", "FIELDS", "from_hf", "parse_pairs", "read_config"]

FIELDS: dict[str, type] = {f.name: type(getattr(ModelConfig(), f.name)) for f in dataclasses.fields(ModelConfig)
                           if f.init}
ALIASES = {"h": "n_heads", "N": "n_layers"}  # the paper's symbols

# What the suite's checks need of the audit configuration, and why (checked after the user's values apply).
SUITE_NEEDS: tuple[tuple[str, int, str], ...] = (
    ("n_layers", 2, "layers.independent's witness of a layer reused N times needs N > 1"),
    ("max_len", 12, "the witness batches reach length 12"),
    ("src_vocab", 4, "the witnesses need a padding id and at least three other tokens"),
    ("tgt_vocab", 4, "the witnesses need a padding id and at least three other tokens"),
)

# ModelConfig field -> the Hugging Face configuration keys that hold it, first found wins.
HF_KEYS: dict[str, tuple[str, ...]] = {
    "d_model": ("d_model", "hidden_size", "dim"),
    "n_heads": ("encoder_attention_heads", "num_attention_heads", "n_heads", "num_heads"),
    "d_ff": ("encoder_ffn_dim", "ffn_dim", "intermediate_size", "d_ff"),
    "n_layers": ("encoder_layers", "num_hidden_layers", "num_layers", "n_layers"),
    "src_vocab": ("src_vocab_size", "vocab_size"),
    "tgt_vocab": ("tgt_vocab_size", "decoder_vocab_size", "vocab_size"),
    "max_len": ("max_position_embeddings", "n_positions", "max_length"),
    "pad_id": ("pad_token_id",),
    "dropout": ("dropout", "hidden_dropout_prob"),
    "norm_eps": ("layer_norm_eps", "layer_norm_epsilon"),
    "share_embeddings": ("share_encoder_decoder_embeddings", "tie_word_embeddings"),
}
# Keys that must agree with the one ModelConfig keeps (ModelConfig has one N and one h for both stacks).
HF_SAME = {"n_layers": ("decoder_layers",), "n_heads": ("decoder_attention_heads",), "d_ff": ("decoder_ffn_dim",)}

ACCEPTED = (f"accepted: a preset ({', '.join(PRESETS)}) optionally followed by key=value pairs (base,N=2); "
            f"{', '.join(FIELDS)} (and h, N) as key=value pairs; a .json or .toml file; or a Hugging Face config.json "
            "or model directory")


class ConfigError(ValueError):
    """A --config that cannot be used; its message is one line."""


def _value(key: str, raw: Any) -> Any:
    """``raw`` (text from key=value, or a JSON/TOML value) as the type of ModelConfig's ``key``."""
    kind = FIELDS[key]
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if str(raw).strip().lower() in ("true", "1", "yes"):
            return True
        if str(raw).strip().lower() in ("false", "0", "no"):
            return False
        raise ConfigError(f"{key}={raw}: not a bool (true or false)")
    try:
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(str(raw).strip()) if isinstance(raw, str) else int(raw)
        return float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={raw}: not {'an int' if kind is int else 'a number'}") from None


def _field(key: str) -> str:
    name = ALIASES.get(key, key)
    if name not in FIELDS:
        raise ConfigError(f"unknown key {key!r}; accepted keys: {', '.join(FIELDS)} (and h, N)")
    return name


def _apply(base: ModelConfig, values: dict[str, Any]) -> ModelConfig:
    """``base`` with ``values`` (ModelConfig field names) applied, validated, and checked against SUITE_NEEDS."""
    changes = dict(values)
    shared = changes.get("share_embeddings", base.share_embeddings)
    given = [k for k in ("src_vocab", "tgt_vocab") if k in changes]
    if shared and len(given) == 1:  # one vocabulary for both sides (§3.4): one size sets both
        other = "tgt_vocab" if given[0] == "src_vocab" else "src_vocab"
        changes[other] = changes[given[0]]
    try:
        config = base.replace(**changes)
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    for name, least, why in SUITE_NEEDS:
        if getattr(config, name) < least:
            raise ConfigError(f"{name}={getattr(config, name)}: the suite needs {name} >= {least} ({why})")
    if config.pad_id == TRANSLATION.bos_id:
        raise ConfigError(f"pad_id={config.pad_id}: the decoding and training witnesses start every target with "
                          f"bos_id {TRANSLATION.bos_id}; the suite needs a pad_id other than {TRANSLATION.bos_id}")
    return config


def parse_pairs(text: str, base: ModelConfig) -> ModelConfig:
    """``d_model=64,h=4,src_vocab=40`` applied to ``base``."""
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise ConfigError(f"{item!r} is not key=value; {ACCEPTED}")
        name = _field(key.strip())
        values[name] = _value(name, raw.strip())
    if not values:
        raise ConfigError(f"no key=value pair given; {ACCEPTED}")
    return _apply(base, values)


def _from_mapping(data: Any, where: str, base: ModelConfig) -> ModelConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: holds {type(data).__name__}, not a table of keys; {ACCEPTED}")
    if "model_type" in data or "architectures" in data:
        return from_hf(data, base, where)
    values: dict[str, Any] = {}
    for key, raw in data.items():
        try:
            name = _field(str(key))
            values[name] = _value(name, raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return _apply(base, values)


def from_hf(data: dict[str, Any], base: ModelConfig, where: str = "config.json") -> ModelConfig:
    """The ModelConfig of a Hugging Face configuration (``HF_KEYS``); a size it does not give keeps ``base``'s.
    Encoder and decoder sizes that differ are refused: ModelConfig has one value for both stacks."""
    values: dict[str, Any] = {}
    for name, keys in HF_KEYS.items():
        key = next((k for k in keys if data.get(k) is not None), None)
        if key is None:
            continue
        try:
            values[name] = _value(name, data[key])
        except ConfigError as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from None
        for other in HF_SAME.get(name, ()):
            if data.get(other) is not None and data[other] != data[key]:
                raise ConfigError(f"{where}: {key}={data[key]} and {other}={data[other]} differ; the audit "
                                  f"configuration has one {name} for both stacks")
    if "share_embeddings" not in values and "src_vocab" in values and "tgt_vocab" in values:
        values["share_embeddings"] = values["src_vocab"] == values["tgt_vocab"]
    if not values:
        raise ConfigError(f"{where}: no size found (looked for {', '.join(k for ks in HF_KEYS.values() for k in ks)})")
    try:
        return _apply(base, values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _read_toml(path: Path) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ConfigError(f"{path}: reading TOML on Python 3.10 needs the tomli package; or give a .json "
                              "file") from None
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def _read_file(path: Path, base: ModelConfig) -> ModelConfig:
    if path.is_dir():
        inside = path / "config.json"
        if not inside.is_file():
            raise ConfigError(f"{path}: a directory without config.json; {ACCEPTED}")
        data = _read_json(inside)
        return from_hf(data, base, str(inside)) if isinstance(data, dict) else _from_mapping(data, str(inside), base)
    if path.suffix == ".toml":
        return _from_mapping(_read_toml(path), str(path), base)
    if path.suffix == ".json":
        return _from_mapping(_read_json(path), str(path), base)
    raise ConfigError(f"{path}: not a .json or .toml file; {ACCEPTED}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None


def read_config(spec: str, base: ModelConfig) -> ModelConfig:
    """The audit configuration ``spec`` names (a Table 3 preset, optionally followed by key=value pairs; key=value
    pairs over ``base``; or a file or directory)."""
    text = spec.strip()
    if not text:
        raise ConfigError(f"empty; {ACCEPTED}")
    path = Path(text).expanduser()
    if path.exists():
        return _read_file(path, base)
    first, _, rest = text.partition(",")
    if first.strip() in PRESETS:
        preset = PRESETS[first.strip()]
        return parse_pairs(rest, preset) if rest.strip() else _apply(preset, {})
    if "=" in text:
        return parse_pairs(text, base)
    raise ConfigError(f"{text}: no such file or directory, and not key=value pairs; {ACCEPTED}")
