"""``--backend-config``: Triton's flag for its backends' settings, as far as this server has them.

Triton's flag is repeatable and takes ``<backend>,<setting>=<value>`` (one backend's) or
``<setting>=<value>`` (every backend's; a backend's own wins over it). oipserve is
Triton's ONNX Runtime backend alone, and takes the one setting of it that changes what a
model is: ``default-max-batch-size``, the ``max_batch_size`` auto-complete gives a model
whose graph can batch and whose configuration gives none (Triton's default 4; a negative
value reads as 0, as in Triton; docs/model-config.md, "Auto-complete"). Another backend,
another setting or a value that is not a number stops start-up with the reason (exit 2):
a setting that changes Triton's behaviour is never ignored in silence.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["BACKEND", "SETTING", "BackendConfigError", "default_max_batch_size"]

#: The one backend, and its one setting, taken.
BACKEND = "onnxruntime"
SETTING = "default-max-batch-size"

#: Largest value taken (a ``max_batch_size`` is an int32 in Triton's configuration).
_INT32_MAX = 2**31 - 1


class BackendConfigError(ValueError):
    """A ``--backend-config`` item that cannot be used; the message says why."""


def default_max_batch_size(items: Iterable[str], default: int) -> int:
    """The ``default-max-batch-size`` the items give (``onnxruntime,`` ones win over the
    backend-agnostic ones, later ones over earlier), else ``default``; negative: 0."""
    found: dict[bool, int] = {}
    for item in items:
        backend, setting, value = _split(item)
        if backend not in ("", BACKEND):
            raise BackendConfigError(
                f"{item!r}: oipserve is Triton's {BACKEND} backend alone; it takes no "
                f"settings of backend '{backend}'"
            )
        if setting != SETTING:
            raise BackendConfigError(
                f"{item!r}: '{setting}' is not a setting oipserve takes (the one it takes: "
                f"{BACKEND},{SETTING}=N)"
            )
        found[bool(backend)] = _number(item, value)
    return max(found.get(True, found.get(False, default)), 0)


def _split(item: str) -> tuple[str, str, str]:
    """Triton's reading: the backend before the first comma, the setting up to the first
    ``=`` after it, the value after that."""
    backend, comma, rest = item.partition(",")
    if not comma:
        backend, rest = "", item
    setting, equals, value = rest.partition("=")
    if (comma and not backend.strip()) or not equals or not setting.strip() or not value.strip():
        raise BackendConfigError(
            f"{item!r}: the format is '<backend name>,<setting>=<value>' or '<setting>=<value>'"
        )
    return backend.strip(), setting.strip(), value.strip()


def _number(item: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise BackendConfigError(f"{item!r}: {SETTING} must be a whole number") from None
    if number > _INT32_MAX:
        raise BackendConfigError(f"{item!r}: {SETTING} must be at most {_INT32_MAX}")
    return number
