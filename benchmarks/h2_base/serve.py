"""Run oipserve with its gRPC connections on python-hyper's ``h2`` (the prototype
``H2LibConnection``), for an A/B against today's HTTP/2:

    python benchmarks/h2_base/serve.py --model-repository ... [oipserve's arguments]

It swaps the class the gRPC listener constructs, then runs oipserve's own main.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.h2_base.connection import H2LibConnection  # noqa: E402
from oipserve.front.grpc import listener  # noqa: E402


def main() -> int:
    listener.Connection = H2LibConnection  # type: ignore[misc,assignment]
    from oipserve.app.cli import main as oipserve_main

    return int(oipserve_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
