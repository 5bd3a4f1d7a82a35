"""Repository control: index, load and unload of the models in the model directory.

The directory is read afresh on every call, so models added, fixed or broken on disk
after start are seen. Loading itself is ``ModelManager``'s job; this module turns its
outcome into the answers the routes give (404 not in the directory, 400 cannot load).
Worker endpoints share the model namespace, so ``is_endpoint`` tells which names belong
to them. ``ModelManager`` serialises repository loads itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from oipserve.errors import InvalidInput, NotFound, Unavailable, Unsupported
from oipserve.models import ModelManager, ModelRegistry
from oipserve.repository import RepositoryError, list_models, read_model


def check_load_parameters(parameters: Mapping[str, object]) -> None:
    """501 for the load parameters Triton defines but this server does not implement."""
    for key in parameters:
        if key == "config" or key.startswith("file:"):
            raise Unsupported(f"load parameter '{key}' is not supported by this server")


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
            return list_models(self.root)
        except RepositoryError as exc:
            raise Unavailable(str(exc)) from None

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model in the directory, loaded or not, one entry per version."""
        entries = []
        for name in self._names():
            versions = self.registry.models.get(name)
            if versions and not self.is_endpoint(name):
                for model in versions.values():
                    state, reason = model.state, model.reason
                    if state == "READY" and not model.ready:
                        state, reason = "UNAVAILABLE", "no running instance (worker restarting)"
                    entries.append(
                        {"name": name, "version": model.version, "state": state, "reason": reason}
                    )
                continue
            reason = self.registry.failed.get(name)
            if reason is None:
                reason = "unloaded" if name in self.registry.unloaded else "not loaded"
            source = read_model(self.root, name)
            for version in list(source.versions) or [""]:
                entries.append(
                    {"name": name, "version": version, "state": "UNAVAILABLE", "reason": reason}
                )
        if ready_only:
            entries = [e for e in entries if e["state"] == "READY"]
        return entries

    async def load(self, name: str, version: str | None) -> None:
        """(Re)load a model from the directory, read afresh; 404 if absent, 400 if broken."""
        if name not in self._names():
            raise NotFound(f"model '{name}' is not in the model repository")
        await self.manager.load(name)
        reason = self.registry.failed.get(name)
        if reason is not None:
            raise InvalidInput(f"failed to load '{name}': {reason}")
        versions = self.registry.models.get(name, {})
        if version is not None and version not in versions:
            raise NotFound(
                f"model '{name}' has no version '{version}' (versions: {', '.join(versions)})"
            )
        chosen = [versions[version]] if version is not None else list(versions.values())
        broken = [m for m in chosen if m.state != "READY"]
        if broken or not chosen:
            reasons = "; ".join(f"version {m.version}: {m.reason}" for m in broken)
            raise InvalidInput(f"failed to load '{name}': {reasons or 'no versions'}")

    async def unload(self, name: str, version: str | None) -> None:
        """Unload a model (or one version); a no-op for names that are not loaded."""
        await self.manager.unload(name, version)

    def served(self) -> list[str]:
        """Names of everything that can infer now (models and endpoints)."""
        return sorted(
            name
            for name, versions in self.registry.models.items()
            if any(v.ready for v in versions.values())
        )


def startup_models(mode: str, load_model: tuple[str, ...], root: Path) -> list[str]:
    """Models to load at start: all in mode "none", the --load-model ones in "explicit"."""
    names = list_models(root)
    if mode == "none" or "*" in load_model:
        return names
    missing = [n for n in load_model if n not in names]
    if missing:
        raise RepositoryError(
            f"--load-model names {', '.join(missing)}, not in the model repository {root}"
        )
    return list(dict.fromkeys(load_model))
