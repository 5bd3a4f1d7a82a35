"""amdinfer's rules for naming worker endpoints: which parameter sets are "the same" endpoint.

Pure bookkeeping, no I/O: ``param_key`` turns a load request's parameters into the typed
key that decides identity, and ``EndpointNames`` hands out ``W``, ``W-0``, ``W-1``, ...
for the distinct keys of each worker name ``W``. Kept apart from the code that creates
endpoints so these rules can be tested (and read) on their own.
"""

from __future__ import annotations

from collections.abc import Mapping

from oipserve.errors import InvalidInput

Scalar = bool | int | float | str
#: Typed parameter set: (name, type tag, value) triples; see ``param_key``.
ParamKey = frozenset[tuple[str, str, Scalar]]

_INT32_MAX = 2**31 - 1


def param_key(worker: str, params: Mapping[str, object]) -> ParamKey:
    """The typed key that decides endpoint identity (amdinfer's rules).

    ``share`` is left out; ``worker`` is added. Non-negative integers are int32,
    negative or fractional numbers (and larger integers) are doubles, so
    ``1`` != ``1.0`` != ``true``; arrays, objects and null are a 400.
    """
    items: list[tuple[str, str, Scalar]] = [("worker", "string", worker)]
    for name, value in params.items():
        if name == "share":
            continue
        if name == "worker":
            raise InvalidInput("parameter 'worker' is set by the server and cannot be given")
        if isinstance(value, bool):
            items.append((name, "bool", value))
        elif isinstance(value, int) and 0 <= value <= _INT32_MAX:
            items.append((name, "int32", value))
        elif isinstance(value, int | float):
            items.append((name, "double", float(value)))
        elif isinstance(value, str):
            items.append((name, "string", value))
        else:
            kind = "null" if value is None else type(value).__name__
            raise InvalidInput(
                f"parameter '{name}' is {kind}; worker parameters must be strings, numbers "
                "or booleans"
            )
    return frozenset(items)


class EndpointNames:
    """amdinfer's endpoint naming for each worker name W.

    The first parameter set gets ``W``, later distinct sets ``W-0``, ``W-1``, ...
    from a counter that only grows; the table and counter are cleared only when
    every endpoint of W is gone.
    """

    def __init__(self) -> None:
        self._tables: dict[str, dict[ParamKey, str]] = {}
        self._counters: dict[str, int] = {}

    def find(self, worker: str, key: ParamKey) -> str | None:
        """The endpoint already serving this parameter set of ``worker``, if any."""
        return self._tables.get(worker, {}).get(key)

    def next_name(self, worker: str) -> str:
        """The name the next new parameter set of ``worker`` would get (nothing changes)."""
        if not self._tables.get(worker):
            return worker
        return f"{worker}-{self._counters.get(worker, 0)}"

    def add(self, worker: str, key: ParamKey) -> str:
        """Take the next name for ``key``; call only once the endpoint exists."""
        name = self.next_name(worker)
        table = self._tables.setdefault(worker, {})
        if table:
            self._counters[worker] = self._counters.get(worker, 0) + 1
        else:
            self._counters[worker] = 0
        table[key] = name
        return name

    def release(self, worker: str, endpoint: str) -> None:
        """Give back a name taken (``add``) for a load that failed: as if never taken.

        Names are taken when a load starts, so that concurrent loads get distinct names
        without holding a lock while they run. A failed load must leave no trace (rule 6):
        the next distinct set gets the name again if no later name was taken meanwhile.
        """
        self.remove(worker, endpoint)
        counter = self._counters.get(worker)
        if counter and endpoint == f"{worker}-{counter - 1}":
            self._counters[worker] = counter - 1

    def remove(self, worker: str, endpoint: str) -> None:
        """Forget ``endpoint``; the last endpoint of ``worker`` gone resets its naming."""
        table = self._tables.get(worker, {})
        for key, name in list(table.items()):
            if name == endpoint:
                del table[key]
        if not table:
            self._tables.pop(worker, None)
            self._counters.pop(worker, None)
