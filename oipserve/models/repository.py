"""Reading a model repository in Triton's layout.

``DIR/<model>/[config.pbtxt]`` and ``DIR/<model>/<version>/model.onnx`` with
numeric versions, of which the config's ``version_policy`` picks those served
(by default the latest, as in Triton). Reading never loads anything; it only says what is there
and what is wrong with it, so a broken model can be reported UNAVAILABLE
while the others are served.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from oipserve.models.config.parse import (
    ModelConfig,
    ModelConfigError,
    VersionPolicy,
    read_model_config,
)
from oipserve.models.labels import LABELS_MAX_BYTES, read_labels

log = logging.getLogger("oipserve.repository")

DEFAULT_MODEL_FILENAME = "model.onnx"


class RepositoryError(Exception):
    """The repository directory itself cannot be read."""


@dataclass(frozen=True)
class ModelSource:
    """What the repository holds for one model; ``error`` is set when it cannot be served."""

    name: str
    directory: Path
    config: ModelConfig | None = None
    #: version string -> path of the model file, for each version the version policy
    #: selects (default: the latest), in ascending order.
    versions: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def version_number(entry: str) -> int | None:
    """The version a directory name stands for, or None: ASCII digits only.

    ``str.isdigit`` accepts e.g. "²", which ``int`` then refuses; Triton's version
    directories are plain decimal numbers.
    """
    if entry.isascii() and entry.isdecimal():
        return int(entry)
    return None


def read_model(root: Path, name: str, override: ModelConfig | None = None) -> ModelSource:
    """What ``root/name`` holds; ``override`` replaces its config.pbtxt (a load's ``config``)."""
    directory = root / name
    if not directory.is_dir():
        return ModelSource(name, directory, error=f"no directory '{name}' in the repository")
    config: ModelConfig | None = override
    config_path = directory / "config.pbtxt"
    what = "config.pbtxt" if override is None else "the configuration given with the load"
    if override is None and config_path.exists():
        try:
            config = read_model_config(config_path)
        except (ModelConfigError, OSError) as exc:
            return ModelSource(name, directory, error=f"config.pbtxt: {exc}")
    if config is not None:
        if config.name is not None and config.name != name:
            return ModelSource(
                name,
                directory,
                config,
                error=f"{what} names the model '{config.name}' but its directory is '{name}'",
            )
        for ignored in config.ignored:
            field_name = (
                f"config.pbtxt field '{ignored}'"
                if override is None
                else f"field '{ignored}' of the configuration given with the load"
            )
            log.warning(
                "model '%s': %s is not supported by oipserve and is ignored", name, field_name
            )
        try:
            config = with_labels(config, directory, what)
        except ValueError as exc:
            return ModelSource(name, directory, config, error=str(exc))
    filename = (config.default_model_filename if config else None) or DEFAULT_MODEL_FILENAME
    found: dict[int, str] = {}
    try:
        entries = sorted(os.listdir(directory))
    except OSError as exc:
        return ModelSource(name, directory, config, error=f"cannot list the directory: {exc}")
    for entry in entries:
        number = version_number(entry)
        model_file = directory / entry / filename
        if number is not None and model_file.is_file():
            found[number] = str(model_file)
    if not found:
        hint = ""
        if (directory / filename).is_file():
            hint = f"; {filename} lies directly in {name}/: move it to {name}/1/{filename}"
        return ModelSource(
            name,
            directory,
            config,
            error=f"no version directory holds {filename} (expected layout "
            f"DIR/<model>/<version>/{filename}, here {name}/<number>/{filename}){hint}",
        )
    policy = config.version_policy if config else VersionPolicy()
    chosen = policy.select(list(found))
    missing = sorted(set(policy.versions) - set(found))
    if missing and chosen:
        log.warning(
            "model '%s': version_policy asks for versions %s, which the repository does not hold",
            name,
            missing,
        )
    if not chosen:
        return ModelSource(
            name,
            directory,
            config,
            error=f"version_policy selects none of the versions found ({sorted(found)}); "
            f"it asks for {list(policy.versions)}",
        )
    return ModelSource(name, directory, config, {str(v): found[v] for v in chosen})


def with_labels(config: ModelConfig, directory: Path, what: str) -> ModelConfig:
    """``config`` with the labels of each output's ``label_filename`` read from ``directory``.

    Each file is read once, and the files of one model hold at most ``LABELS_MAX_BYTES``
    in all (ValueError past it): a configuration may name one file for thousands of
    outputs, which read it once each took that many times its size.
    """
    if not any(output.label_filename for output in config.outputs):
        return config
    read: dict[str, tuple[str, ...]] = {}
    total = 0
    outputs = []
    for output in config.outputs:
        name = output.label_filename
        if name and name not in read:
            labels = read[name] = read_labels(directory, name, f"{what} output '{output.name}'")
            total += max(sum(len(label) + 1 for label in labels) - 1, 0)  # its characters
            if total > LABELS_MAX_BYTES:
                raise ValueError(
                    f"{what}: the label files of its outputs hold more than "
                    f"{LABELS_MAX_BYTES} characters in all"
                )
        outputs.append(msgspec.structs.replace(output, labels=read[name]) if name else output)
    return msgspec.structs.replace(config, outputs=tuple(outputs))


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


def layout_warnings(root: Path) -> list[str]:
    """What makes a readable repository serve nothing at all: no model directory.

    Models whose directory holds no usable version are reported per model when they
    fail to load (``read_model``'s reason names the expected layout).
    """
    if list_models(root):
        return []
    message = (
        f"the model repository {root} holds no model directory, so no model will be served; "
        f"the expected layout is {root}/<model>/<version>/{DEFAULT_MODEL_FILENAME}"
    )
    loose = sorted(p.name for p in root.glob("*.onnx") if p.is_file())
    if loose:
        stem = loose[0].removesuffix(".onnx")
        message += (
            f" (found {', '.join(loose)} directly in it: move {loose[0]} to "
            f"{root}/{stem}/1/{DEFAULT_MODEL_FILENAME})"
        )
    return [message]
