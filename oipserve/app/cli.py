"""``oipserve`` command line: exit 0 after a clean shutdown, non-zero when start-up fails."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

import uvloop

from oipserve.app.server import STOP_SIGNALS, StartupError, serve
from oipserve.config.settings import SettingsError, configure_logging, load_settings

EXIT_STARTUP_FAILURE = 3


def main(argv: Sequence[str] | None = None) -> int:
    try:
        command, settings = load_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except SettingsError as exc:
        print(f"oipserve: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(serve(settings))
    except StartupError as exc:
        print(f"oipserve: error: {exc}", file=sys.stderr)
        return EXIT_STARTUP_FAILURE
    finally:
        # The loop closed gives the stop signals their default action back: the server
        # is done, so one now (a second Ctrl-C, a supervisor's resend) changes nothing.
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
