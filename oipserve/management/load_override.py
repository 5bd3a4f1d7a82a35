"""The parameters of a repository load: ``config`` and ``file:<version>/<file>``, as Triton's.

``config`` is a model configuration in protobuf's JSON mapping (a JSON string), which
replaces the directory's config.pbtxt for this load. ``file:`` parameters are the files
of a model directory (base64 strings over HTTP, bytes over gRPC); with them ``config``
must be given, and the model need not be in the repository. Nothing else is accepted.

Every refusal is a 400 whose message starts ``failed to load '<name>'``, the phrase
Triton's clients look for, and goes on with the reason.

What is checked here runs on the event loop before the load waits for anything, so it
is bounded first: more than ``--max-upload-files`` files are refused before any of them
is looked at (a load of 100,000 files took 1.7 s of the loop to check and decode, then
6 s to write). Each remaining file costs a path check; its contents are not touched
here: base64 text is decoded by the writer's thread (``oipserve.models.uploads``). Their total
size is bounded by the request's (``--max-request-bytes``, ``--grpc-max-message-bytes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from oipserve.errors import InvalidInput
from oipserve.models.config.parse import ModelConfig, ModelConfigError, parse_model_config_json
from oipserve.models.uploads import (
    NAME_MAX,
    UploadError,
    UploadFiles,
    check_layout,
    check_upload_path,
)

__all__ = [
    "LoadOverride",
    "check_model_name",
    "failed_to_load",
    "parse_load_parameters",
    "unload_dependents",
]

FILE_PREFIX = "file:"


def failed_to_load(name: str, reason: str) -> InvalidInput:
    """The 400 of a load that failed, in the words Triton's clients match on."""
    return InvalidInput(f"failed to load '{name}': {reason}")


@dataclass(frozen=True)
class LoadOverride:
    """What a load gives instead of the repository: a configuration, model files."""

    config: ModelConfig | None = None
    #: Contents as given: bytes (gRPC), or base64 text (HTTP) decoded when written.
    files: UploadFiles = field(default_factory=dict)


def check_model_name(name: str) -> None:
    """400 for a name that cannot be a model directory (Triton refuses the same)."""
    if not name:
        raise failed_to_load(name, "the model name is empty")
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise failed_to_load(
            name, "a model name must not contain '/', '\\' or NUL, nor be '.' or '..'"
        )
    if len(name.encode()) > NAME_MAX:
        raise failed_to_load(name[:32] + "...", f"the model name is longer than {NAME_MAX} bytes")


def parse_load_parameters(
    name: str, parameters: Mapping[str, object], files_in_base64: bool, max_files: int
) -> LoadOverride:
    """The override a load's parameters ask for; 400 (``failed to load``) for any mistake.

    ``files_in_base64``: HTTP sends file contents as base64 strings, gRPC as bytes.
    ``max_files``: most ``file:`` parameters (``--max-upload-files``).
    """
    count = sum(key.startswith(FILE_PREFIX) for key in parameters)
    if count > max_files:
        raise failed_to_load(
            name,
            f"the load gives {count} files, more than --max-upload-files {max_files} (the limit)",
        )
    config: ModelConfig | None = None
    files: dict[PurePosixPath, bytes | str] = {}
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise failed_to_load(
                    name,
                    "load parameter 'config' must be a string holding the model configuration "
                    "as JSON (protobuf's JSON mapping of Triton's ModelConfig)",
                )
            try:
                config = parse_model_config_json(value)
            except ModelConfigError as exc:
                raise failed_to_load(name, f"invalid config override: {exc}") from None
        elif key.startswith(FILE_PREFIX):
            try:
                path = check_upload_path(key[len(FILE_PREFIX) :])
            except UploadError as exc:
                raise failed_to_load(name, f"Invalid file path '{key[:64]}': {exc}") from None
            files[path] = _file_contents(name, key, value, files_in_base64)
        else:
            raise failed_to_load(
                name,
                f"unrecognized load parameter '{key[:64]}' (this server takes 'config' and "
                "'file:<version>/<file>')",
            )
    if files:
        if config is None:
            raise failed_to_load(
                name, "load parameter 'config' must be specified for model file override"
            )
        try:
            check_layout(list(files))
        except UploadError as exc:
            raise failed_to_load(name, f"Invalid file path: {exc}") from None
    return LoadOverride(config, files)


def _file_contents(name: str, key: str, value: object, in_base64: bool) -> bytes | str:
    """The value of a ``file:`` parameter, of the type its protocol sends (not decoded)."""
    if not in_base64:
        if not isinstance(value, bytes):
            raise failed_to_load(name, f"file parameter '{key[:64]}' must be a bytes_param")
        return value
    if not isinstance(value, str):
        raise failed_to_load(name, f"file parameter '{key[:64]}' must be a base64 string")
    return value


def unload_dependents(parameters: Mapping[str, object]) -> bool:
    """An unload's ``unload_dependents`` parameter (Triton's): whether the composing models
    loaded for an ensemble go with it. A boolean or nothing; other parameters are ignored,
    as Triton ignores them."""
    value = parameters.get("unload_dependents", False)
    if not isinstance(value, bool):
        raise InvalidInput(
            "invalid value type for 'unload_dependents' parameter, expected a boolean "
            "(bool_param over gRPC)"
        )
    return value
