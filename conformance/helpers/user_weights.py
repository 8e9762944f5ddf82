"""``--weights PATH``: the user's trained weights, loaded into every model the suite builds at the audit
configuration (``harness.build_model``).

Accepted: a torch state_dict (``.pt``, ``.pth``, ``.bin``; also one wrapped as ``{"state_dict": ...}``,
``{"model": ...}`` or ``{"model_state_dict": ...}``, and a ``module.`` prefix of DataParallel), a
``.safetensors`` file, or a Hugging Face model directory (``config.json`` with ``model.safetensors`` or
``pytorch_model.bin``).

The weights are in the implementation's own names. They are loaded into the module of the built model whose
state_dict shares most keys with them (the model itself, or the library model an adapter wraps); every key must
be the model's, of the model's shape, and every trainable parameter of the model must be given (one tied to a
given one, as an output projection tied to the embedding, counts as given; buffers and frozen parameters, such
as a sinusoid table a library leaves out of its checkpoints, may be missing and keep the model's own values).
Anything else is refused before any check runs, in one line naming the first mismatching key
(:class:`WeightsError`).

Sizes: from ``--config``; without it, from the model directory's ``config.json`` (the only case where the
sizes are known from the weights without guessing); a bare state_dict without ``--config`` is checked at the
suite's own sizes, and a mismatch says to give ``--config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aiayn_conformance.spec.config import ModelConfig

from .user_config import ConfigError, from_hf, read_config

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["ACCEPTED", "UserWeights", "WeightsError", "fit_problem", "read_checkpoint", "read_weights", "resolve"]

ACCEPTED = ("accepted: a torch state_dict (.pt, .pth, .bin), a .safetensors file, or a Hugging Face model "
            "directory (config.json with model.safetensors or pytorch_model.bin)")
WRAPPERS = ("state_dict", "model_state_dict", "model")
HF_FILES = ("model.safetensors", "pytorch_model.bin")


class WeightsError(ValueError):
    """Weights that cannot be used; the message is one line."""


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


@dataclass
class UserWeights:
    """The user's state dict, where it came from, and the config.json beside it (a model directory)."""

    path: str
    state: dict[str, torch.Tensor]
    hf_config: dict[str, Any] | None = None
    build: Any = None  # a toolkit checkpoint's own build (Checkpoint.build), used instead of the registration's
    describes: str = ""  # what a toolkit's checkpoint reader found

    def target(self, model: torch.nn.Module) -> tuple[str, torch.nn.Module]:
        """(prefix, module): the module of ``model`` whose state_dict keys share most with the weights', the
        outermost of equals."""
        keys = set(self.state)
        best: tuple[int, str, torch.nn.Module] | None = None
        for prefix, module in model.named_modules():
            score = len(keys & set(module.state_dict()))
            if best is None or score > best[0]:
                best = (score, prefix, module)
        if best is None or best[0] == 0:
            first = next(iter(self.state))
            ours = next(iter(model.state_dict()), "(none)")
            raise WeightsError(f"{self.path}: no key of the weights is the model's: the first, {first!r}, names "
                               f"nothing in the model (whose first key is {ours!r}); the weights must be in the "
                               "implementation's own names")
        return best[1], best[2]

    def mismatch(self, model: torch.nn.Module) -> str:
        """The first mismatch between the weights and ``model`` ("" when they fit), one line."""
        try:
            prefix, module = self.target(model)
        except WeightsError as exc:
            return str(exc)
        where = f" (in {prefix})" if prefix else ""
        own = module.state_dict(keep_vars=True)
        for key, tensor in self.state.items():
            if key not in own:
                return (f"{self.path}: key {key!r} {_shape(tensor)} is not in the model{where}, whose state_dict has "
                        f"{len(own)} keys such as {next(iter(own))!r}")
            if tuple(own[key].shape) != tuple(tensor.shape):
                return (f"{self.path}: key {key!r} has shape {_shape(tensor)}, the model's{where} has "
                        f"{_shape(own[key])}; give the sizes the weights were trained at with --config")
        given = {own[k].untyped_storage().data_ptr() for k in self.state if k in own}
        for key, tensor in own.items():
            trained = isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad
            if trained and key not in self.state and tensor.untyped_storage().data_ptr() not in given:
                return (f"{self.path}: the model's {key!r} {_shape(tensor)}{where} is not in the weights; every "
                        "trainable parameter must be given")
        return ""

    def load_into(self, model: torch.nn.Module) -> None:
        """Load the weights into ``model`` (checked by :meth:`mismatch` before the session)."""
        _, module = self.target(model)
        with torch.no_grad():
            module.load_state_dict(self.state, strict=False)


def _tensors(obj: Any, where: str) -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping):
        for wrapper in WRAPPERS:
            inner = obj.get(wrapper)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                obj = inner
                break
    if not isinstance(obj, Mapping) or not obj:
        raise WeightsError(f"{where}: holds {type(obj).__name__}, not a state_dict of tensors; {ACCEPTED}")
    bad = next((k for k, v in obj.items() if not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise WeightsError(f"{where}: entry {bad!r} is {type(obj[bad]).__name__}, not a tensor; {ACCEPTED}")
    state = {str(k): v for k, v in obj.items()}
    if all(k.startswith("module.") for k in state):  # saved from DataParallel / DistributedDataParallel
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise WeightsError(f"{path}: reading .safetensors needs the safetensors package "
                               "(pip install safetensors)") from None
        try:
            return _tensors(load_file(str(path), device="cpu"), str(path))
        except WeightsError:
            raise
        except Exception as exc:
            raise WeightsError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc})") from None
    if path.suffix in (".pt", ".pth", ".bin"):
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise WeightsError(f"{path}: torch.load(weights_only=True) failed ({type(exc).__name__}: "
                               f"{text[:200]}); {ACCEPTED}") from None
        return _tensors(obj, str(path))
    raise WeightsError(f"{path}: unknown kind of file; {ACCEPTED}")


def read_weights(spec: str) -> UserWeights:
    """The weights at ``spec`` (a file or a Hugging Face model directory)."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise WeightsError(f"{spec}: no such file or directory; {ACCEPTED}")
    if not path.is_dir():
        return UserWeights(str(path), _load_file(path))
    found = next((path / name for name in HF_FILES if (path / name).is_file()), None)
    if found is None:
        raise WeightsError(f"{path}: a directory without {' or '.join(HF_FILES)}; {ACCEPTED}")
    hf_config = None
    if (path / "config.json").is_file():
        import json

        try:
            hf_config = json.loads((path / "config.json").read_text())
        except ValueError as exc:
            raise WeightsError(f"{path / 'config.json'}: not valid JSON ({exc})") from None
    return UserWeights(str(found), _load_file(found), hf_config if isinstance(hf_config, dict) else None)


def read_checkpoint(impl: Implementation, spec: str) -> tuple[UserWeights, ModelConfig]:
    """The weights and sizes of a checkpoint as ``impl``'s toolkit saved it (``impl.read_checkpoint``)."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise WeightsError(f"{spec}: no such file or directory")
    reader = impl.read_checkpoint
    assert reader is not None
    try:
        found = reader(str(path))
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WeightsError(f"{spec}: {text}" if isinstance(exc, ValueError) else
                           f"{spec}: {impl.name}'s checkpoint reader raised {type(exc).__name__}: {text}") from None
    state = _tensors(dict(found.state), str(path))
    return UserWeights(str(path), state, build=found.build, describes=found.describes), found.config


def resolve(config_spec: str | None, weights_path: str | None, base: ModelConfig,
            impls: list[Implementation] | None = None) -> tuple[ModelConfig | None, UserWeights | None, str]:
    """(the audit configuration, or None for the suite's own; the weights, or None; where the sizes come from)
    for ``--config`` and ``--weights``; a ConfigError or WeightsError, one line prefixed with the option, else.
    With one implementation that reads its toolkit's checkpoints (``read_checkpoint``), ``--weights`` is read by
    it, and the sizes come from the checkpoint unless ``--config`` gives them."""
    try:
        config = read_config(config_spec, base) if config_spec else None
    except ConfigError as exc:
        raise ConfigError(f"--config: {exc}") from None
    reader = impls[0] if impls is not None and len(impls) == 1 and impls[0].read_checkpoint is not None else None
    from_checkpoint = False
    weights: UserWeights | None = None
    try:
        if weights_path and reader is not None:
            weights, saved = read_checkpoint(reader, weights_path)
            if config is None:
                config, from_checkpoint = saved, True
        else:
            weights = read_weights(weights_path) if weights_path else None
        if config is None and weights is not None and weights.hf_config is not None:
            config = from_hf(weights.hf_config, base, f"{weights_path}/config.json")
    except (ConfigError, WeightsError) as exc:
        raise WeightsError(f"--weights: {exc}") from None
    sizes = ("--config" if config_spec else "the checkpoint" if from_checkpoint
             else "the weights' config.json" if config is not None else "the suite's own sizes")
    return config, weights, sizes


def fit_problem(impls: list[Implementation], config: ModelConfig, weights: UserWeights) -> str:
    """Why ``weights`` cannot be audited on ``impls`` built at ``config`` ("" when they fit), one line."""
    if len(impls) != 1:
        return (f"--weights: give exactly one implementation with --impl (the weights' own), got {len(impls)}: "
                f"{', '.join(i.name for i in impls) or 'none'}")
    impl = impls[0]
    if impl.unavailable:
        return f"--weights: {impl.name} is unavailable: {impl.unavailable}"
    build = weights.build if weights.build is not None else impl.build
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build(config)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return f"--weights: {impl.name}.build(audit configuration) raised {type(exc).__name__}: {text}"
    if not isinstance(model, torch.nn.Module):
        return f"--weights: {impl.name}.build returned {type(model).__name__}, not a torch.nn.Module"
    problem = weights.mismatch(model)
    return f"--weights: {problem}" if problem else ""
