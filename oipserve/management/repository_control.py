"""Repository control: index, load and unload of the models in the model directory.

The directory is read afresh on every call, so models added, fixed or broken on disk
after start are seen; a load may also bring its own configuration and files
(``load_override``). Loading itself is ``ModelManager``'s job; this module turns its
outcome into the answers the routes give (400 ``failed to load '<name>': <reason>``).
Worker endpoints share the model namespace, so ``is_endpoint`` tells which names belong
to them. ``ModelManager`` serialises repository loads itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from oipserve.errors import Unavailable, Unsupported
from oipserve.management.load_override import LoadOverride, check_model_name, failed_to_load
from oipserve.models.manager import ModelManager
from oipserve.models.registry import ModelRegistry
from oipserve.models.repository import Repository, RepositoryError


def check_repository_name(name: str) -> None:
    """Refuse a request that names a repository, as Triton does (its repository API takes
    one, and answers ``'repository_name' specification is not supported``); there is one
    here, ``--model-repository``."""
    if name:
        raise Unsupported("'repository_name' specification is not supported")


class RepositoryControl:
    """The model directory as the repository API sees it."""

    def __init__(
        self,
        root: Path,
        registry: ModelRegistry,
        manager: ModelManager,
        is_endpoint: Callable[[str], bool],
    ) -> None:
        self.root = root
        self.registry = registry
        self.manager = manager
        self.is_endpoint = is_endpoint

    def _names(self) -> list[str]:
        try:
            return self.manager.repository.names()
        except RepositoryError as exc:
            raise Unavailable(str(exc)) from None

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model in the directory, loaded or not: one entry per version of a model
        loaded, unloaded or failed, and a model never loaded by its name alone, as Triton
        lists it (no version, state or reason: nothing has been tried)."""
        entries: list[dict[str, str]] = []
        loaded = (n for n in self.registry.models if not self.is_endpoint(n))
        uploaded = self.registry.unloaded_versions  # (and unloaded whole: no directory)
        for name in sorted({*self._names(), *loaded, *uploaded}):
            versions = self.registry.models.get(name)
            if versions and not self.is_endpoint(name):
                for model in versions.values():
                    state, reason = model.state, model.reason
                    if state == "READY" and not model.ready:
                        # NOTE: an ensemble's readiness says why (a step not ready, or
                        #   no longer fitting); a model's is its instances'.
                        why = model.reason or "no running instance (worker restarting)"
                        state, reason = "UNAVAILABLE", why
                    entries.append(
                        {"name": name, "version": model.version, "state": state, "reason": reason}
                    )
                for version in sorted(self.registry.unloaded_versions.get(name, ()), key=int):
                    if version not in versions:
                        entries.append(
                            {"name": name, "version": version, "state": "UNAVAILABLE",
                             "reason": "unloaded"}
                        )  # fmt: skip
                continue
            failure = self.registry.failed.get(name)
            if failure is None and name not in self.registry.unloaded:
                entries.append({"name": name})
                continue
            why = failure or "unloaded"
            gone = self.registry.unloaded_versions.get(name)
            if gone:
                listed = sorted(gone, key=int)
            else:
                listed = list(self.manager.repository.read(name).versions) or [""]
            for version in listed:
                entries.append(
                    {"name": name, "version": version, "state": "UNAVAILABLE", "reason": why}
                )
        if ready_only:
            entries = [e for e in entries if e.get("state") == "READY"]
        return entries

    async def load(
        self,
        name: str,
        version: str | None,
        override: LoadOverride,
        timeout: float | None = None,
    ) -> None:
        """(Re)load a model, from the directory read afresh or from the override given.

        Any failure is a 400 starting ``failed to load '<name>'`` (Triton's words) with the
        reason; past ``timeout`` seconds a 503.
        """
        check_model_name(name)
        if not override.files and name not in self._names():
            raise failed_to_load(name, f"there is no model directory '{name}' in the repository")
        reason = await self.manager.load(name, override.config, override.files, timeout)
        if reason is not None:
            raise failed_to_load(name, reason)
        versions = self.registry.models.get(name, {})
        if version is not None and version not in versions:
            raise failed_to_load(
                name, f"it has no version '{version}' (versions: {', '.join(versions)})"
            )
        chosen = [versions[version]] if version is not None else list(versions.values())
        if not chosen:
            raise failed_to_load(name, "no versions")

    async def unload(self, name: str, version: str | None, dependents: bool = False) -> None:
        """Unload a model (or one version); a no-op for names that are not loaded.
        ``dependents``: the composing models loaded for an ensemble go with it."""
        await self.manager.unload(name, version, dependents)

    def served(self) -> list[str]:
        """Names of everything that can infer now (models and endpoints)."""
        return sorted(
            name
            for name, versions in self.registry.models.items()
            if any(v.ready for v in versions.values())
        )


def startup_models(mode: str, load_model: tuple[str, ...], root: Path | Repository) -> list[str]:
    """Models to load at start: all in mode "none", the --load-model ones in "explicit"."""
    repository = root if isinstance(root, Repository) else Repository(root)
    names = repository.names()
    if mode == "none" or "*" in load_model:
        return names
    missing = [n for n in load_model if n not in names]
    if missing:
        raise RepositoryError(
            f"--load-model names {', '.join(missing)}, not in the model repository "
            f"{repository.root}"
        )
    return list(dict.fromkeys(load_model))
