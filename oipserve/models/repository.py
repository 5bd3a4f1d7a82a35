"""Reading a model repository in Triton's layout, or one model under a given name.

``DIR/<model>/[config.pbtxt]`` and ``DIR/<model>/<version>/model.onnx`` with
numeric versions, of which the config's ``version_policy`` picks those served
(by default the latest, as in Triton). Reading never loads anything; it only says what is there
and what is wrong with it, so a broken model can be reported UNAVAILABLE
while the others are served.

``Repository`` adds ``--model-name`` (KServe passes the InferenceService's name): a
repository that is one model, whatever its bucket held (a bare ``model.onnx``, a model's
own directory, a single model directory), is served under that name (docs/deploy.md).
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
from oipserve.models.config.sequence import read_initial_states
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
    """The version a directory name stands for, or None: ASCII digits only, and no leading
    zero (``0`` itself is version 0).

    ``str.isdigit`` accepts e.g. "²", which ``int`` then refuses; Triton's version
    directories are plain decimal numbers, and Triton ignores one with a leading zero
    (core's model repository manager: ``01`` beside ``1`` is not a second version 1).
    """
    if entry.isascii() and entry.isdecimal() and (entry == "0" or entry[0] != "0"):
        return int(entry)
    return None


def _leading_zeros(name: str, entries: list[str]) -> None:
    """Say which version directories are ignored for a leading zero, as Triton says it."""
    for entry in entries:
        if len(entry) > 1 and entry[0] == "0" and entry.isascii() and entry.isdecimal():
            log.warning(
                "model '%s': ignore version directory '%s' which contains leading zeros in "
                "its directory name",
                name,
                entry,
            )


def read_model(root: Path, name: str, override: ModelConfig | None = None) -> ModelSource:
    """What ``root/name`` holds; ``override`` replaces its config.pbtxt (a load's ``config``)."""
    directory = root / name
    if not directory.is_dir():
        return ModelSource(name, directory, error=f"no directory '{name}' in the repository")
    return read_directory(directory, name, override)


def read_directory(
    directory: Path, name: str, override: ModelConfig | None = None, renamed: bool = False
) -> ModelSource:
    """What the model directory ``directory`` holds, served as ``name``.

    ``renamed``: the directory is served under a name of the operator's (``--model-name``),
    not its own. Its configuration may then name the model as its bucket knew it, and a
    model file lying directly in it is version 1 (KServe's buckets often hold just that).
    """
    config: ModelConfig | None = override
    config_path = directory / "config.pbtxt"
    what = "config.pbtxt" if override is None else "the configuration given with the load"
    if override is None and config_path.exists():
        try:
            config = read_model_config(config_path)
        except (ModelConfigError, OSError) as exc:
            return ModelSource(name, directory, error=f"config.pbtxt: {exc}")
    if config is not None:
        if config.name is not None and config.name != name and not renamed:
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
            if config.sequence_batching is not None:  # initial_state data files (Triton's)
                states = read_initial_states(config.sequence_batching, directory)
                config = msgspec.structs.replace(config, sequence_batching=states)
        except ValueError as exc:
            return ModelSource(name, directory, config, error=str(exc))
    filename = (config.default_model_filename if config else None) or DEFAULT_MODEL_FILENAME
    found: dict[int, str] = {}
    try:
        entries = sorted(os.listdir(directory))
    except OSError as exc:
        return ModelSource(name, directory, config, error=f"cannot list the directory: {exc}")
    _leading_zeros(name, entries)
    for entry in entries:
        number = version_number(entry)
        model_file = directory / entry / filename
        if number is not None and model_file.is_file():
            found[number] = str(model_file)
        elif number is not None and config is not None and config.ensemble is not None:
            # NOTE: an ensemble's version directories hold no model file (Triton's layout).
            if (directory / entry).is_dir():
                found[number] = str(directory / entry)
    if not found and renamed and (directory / filename).is_file():
        found[1] = str(directory / filename)
    if not found:
        return ModelSource(
            name, directory, config, error=_no_model_file(directory, name, filename, renamed)
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


def _no_model_file(directory: Path, name: str, filename: str, renamed: bool) -> str:
    """Why ``directory`` serves no version, with the layout that would."""
    if renamed:
        return (
            f"no model file in {directory}: expected {directory}/{filename} (version 1) or "
            f"{directory}/<version>/{filename}"
        )
    hint = ""
    if (directory / filename).is_file():
        hint = (
            f"; {filename} lies directly in {name}/: move it to {name}/1/{filename} (or, if "
            "it is the repository's only model, serve it with --model-name)"
        )
    return (
        f"no version directory holds {filename} (expected layout "
        f"DIR/<model>/<version>/{filename}, here {name}/<number>/{filename}){hint}"
    )


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
            f"{root}/{stem}/1/{DEFAULT_MODEL_FILENAME}, or serve it as one model with "
            f"--model-name NAME, as {root}/{DEFAULT_MODEL_FILENAME})"
        )
    return [message]


@dataclass(frozen=True)
class Repository:
    """The model repository, and the names its models are served under.

    Without ``model_name`` it is a Triton repository: each directory of ``root`` is a
    model named after it. With ``model_name`` (``--model-name``; KServe's runtime passes
    the InferenceService's name), a repository that is one model is served under that
    name, so ``/v2/models/<isvc-name>/infer`` works whatever the bucket held:

    - ``root`` is the model's own directory: ``root/model.onnx`` (version 1) or
      ``root/<version>/model.onnx``, with ``root/config.pbtxt`` or without (a storage URI
      that points at one model, which KServe copies to ``/mnt/models``);
    - ``root`` holds exactly one directory, and it is the model (``<any>/1/model.onnx``,
      ``<any>/model.onnx``): a storage URI that points at a one-model repository.

    A repository of several models is served as without it, each under its own name.
    The directory is read afresh on each call, as the repository API wants.
    """

    root: Path
    model_name: str | None = None

    def model_directory(self) -> Path | None:
        """The directory served as ``model_name``; None when the repository is served as
        a Triton repository (no ``model_name``, or several models)."""
        if self.model_name is None:
            return None
        if _is_model_directory(self.root):
            return self.root
        names = list_models(self.root)
        return self.root / names[0] if len(names) == 1 else None

    def names(self) -> list[str]:
        """The names the repository serves, sorted; RepositoryError if it is unreadable."""
        if self.model_name is not None and self.model_directory() is not None:
            return [self.model_name]
        return list_models(self.root)

    def read(self, name: str, override: ModelConfig | None = None) -> ModelSource:
        """What the repository holds for ``name`` (``read_model``, through the renaming)."""
        directory = self.model_directory()
        if directory is None:
            return read_model(self.root, name, override)
        if name != self.model_name:
            return ModelSource(
                name,
                self.root / name,
                error=f"the repository is one model, served as '{self.model_name}' "
                "(--model-name); it has no other",
            )
        return read_directory(directory, name, override, renamed=True)

    def check(self) -> None:
        """RepositoryError unless ``root`` is a readable directory."""
        check_repository(self.root)

    def layout_warnings(self) -> list[str]:
        """``layout_warnings``, or none when the repository is served as ``model_name``."""
        if self.model_name is not None and self.model_directory() is not None:
            return []
        return layout_warnings(self.root)

    def layout_notes(self) -> list[str]:
        """A warning at start when ``model_name`` names no model served (several models;
        the load lines say where the one model served as ``model_name`` comes from)."""
        if self.model_name is None or self.model_directory() is not None:
            return []
        names = list_models(self.root)
        if not names or self.model_name in names:
            return []
        return [
            f"--model-name {self.model_name}: the model repository {self.root} holds "
            f"{len(names)} models, each served under its own name ({', '.join(names[:5])}"
            + (", ..." if len(names) > 5 else "")
            + f"); none is served as '{self.model_name}'"
        ]


def _is_model_directory(directory: Path) -> bool:
    """``directory`` is a model's own directory, not a repository of them: it holds a
    config.pbtxt, a model.onnx or a version (numeric) directory. A Triton repository holds
    only model directories, and a model named by a number is served by its number only
    without ``--model-name``."""
    if (directory / "config.pbtxt").is_file() or (directory / DEFAULT_MODEL_FILENAME).is_file():
        return True
    try:
        entries = os.listdir(directory)
    except OSError:
        return False
    return any(version_number(e) is not None and (directory / e).is_dir() for e in entries)
