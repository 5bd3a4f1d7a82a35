"""Each Infer says whether its front had anything else in flight (``Infer.light``), with or
without ``--low-load-colocation``: a worker polls for its next request only after one sent
at a busier time (``workers.busy_poll``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from oipserve.dataplane.plane import DataPlane
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.wire.messages import Infer
from tests.support.worker_links import LinkToNoWorker


def test_an_infer_is_light_while_it_is_its_front_s_only_request_in_flight() -> None:
    async def scenario() -> list[bool]:
        plane = DataPlane(ModelRegistry(), SimpleNamespace(prefix="oipserve-light-"), 1)  # type: ignore[arg-type]
        link = LinkToNoWorker()
        model = ModelVersion("identity_fp32", "1", "", None)
        sends = []
        for _ in range(2):  # the first alone in flight, the second beside it
            plane.busy_poll.started()
            sends.append(asyncio.ensure_future(plane._dispatch.send(link.link, model, [], [], [])))
            await asyncio.sleep(0)
        for task in sends:
            task.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
        return [m.light for m in link.sent() if isinstance(m, Infer)]

    assert asyncio.run(scenario()) == [True, False]
