"""Reading a model repository in Triton's layout.

``DIR/<model>/[config.pbtxt]`` and ``DIR/<model>/<version>/model.onnx`` with
numeric versions. Reading never loads anything; it only says what is there
and what is wrong with it, so a broken model can be reported UNAVAILABLE
while the others are served.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from oipserve.model_config import ModelConfig, ModelConfigError, read_model_config

DEFAULT_MODEL_FILENAME = "model.onnx"


class RepositoryError(Exception):
    """The repository directory itself cannot be read."""


@dataclass(frozen=True)
class ModelSource:
    """What the repository holds for one model; ``error`` is set when it cannot be served."""

    name: str
    directory: Path
    config: ModelConfig | None = None
    #: version string -> path of the model file, for every numeric version directory.
    versions: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def _version_key(version: str) -> int:
    return int(version)


def read_model(root: Path, name: str) -> ModelSource:
    directory = root / name
    if not directory.is_dir():
        return ModelSource(name, directory, error=f"no directory '{name}' in the repository")
    config: ModelConfig | None = None
    config_path = directory / "config.pbtxt"
    if config_path.exists():
        try:
            config = read_model_config(config_path)
        except (ModelConfigError, OSError, UnicodeDecodeError) as exc:
            return ModelSource(name, directory, error=f"config.pbtxt: {exc}")
        if config.name is not None and config.name != name:
            return ModelSource(
                name,
                directory,
                config,
                error=f"config.pbtxt names the model '{config.name}' but its directory is '{name}'",
            )
        if config.platform not in (None, "onnxruntime_onnx") or config.backend not in (
            None,
            "onnxruntime",
        ):
            return ModelSource(
                name,
                directory,
                config,
                error="only ONNX models (platform onnxruntime_onnx, backend onnxruntime) "
                f"are served; config.pbtxt says platform={config.platform!r} "
                f"backend={config.backend!r}",
            )
    filename = (config.default_model_filename if config else None) or DEFAULT_MODEL_FILENAME
    versions: dict[str, str] = {}
    try:
        entries = sorted(os.listdir(directory))
    except OSError as exc:
        return ModelSource(name, directory, config, error=f"cannot list the directory: {exc}")
    for entry in entries:
        if not entry.isdigit():
            continue
        model_file = directory / entry / filename
        if model_file.is_file():
            versions[str(int(entry))] = str(model_file)
    if not versions:
        return ModelSource(
            name,
            directory,
            config,
            error=f"no version directory holds {filename} (expected {name}/<number>/{filename})",
        )
    ordered = dict(sorted(versions.items(), key=lambda kv: _version_key(kv[0])))
    return ModelSource(name, directory, config, ordered)


def list_models(root: Path) -> list[str]:
    """Names of the model directories in the repository, sorted."""
    try:
        entries = sorted(os.listdir(root))
    except OSError as exc:
        raise RepositoryError(f"cannot read the model repository {root}: {exc}") from None
    return [e for e in entries if not e.startswith(".") and (root / e).is_dir()]


def check_repository(root: Path) -> None:
    if not root.is_dir():
        raise RepositoryError(f"the model repository {root} is not a directory")
    list_models(root)
