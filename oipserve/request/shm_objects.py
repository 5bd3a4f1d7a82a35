"""A client's shared-memory object, named by the key it registers (``client_regions``).

A key must be one POSIX name in /dev/shm, never a path out of it; the object is opened by
that name read/write, a symbolic link refused rather than followed, and a failure to
open it is the client's mistake (400) unless this process has no descriptor left (503,
which may pass). The registry opens an object to check it at registration, and a
request's hold (``region_use.RegionUse``) opens it again for each ``pread``/``pwrite``.
"""

from __future__ import annotations

import errno
import os

from oipserve.errors import InvalidInput, Unavailable
from oipserve.wire.shm import SHM_DIR

#: errno values that say this process (or the system) has no descriptor left.
NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def object_name(key: str) -> str:
    """The name of ``key``'s object in /dev/shm; InvalidInput unless it is one POSIX name.

    One leading ``/`` is allowed (``shm_open``'s form, what tritonclient sends); no other
    ``/``, no ``..``, no NUL, not empty: a key can never name a file outside /dev/shm.
    """
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or ".." in name or "\0" in name or name == ".":
        raise InvalidInput(
            f"shared memory key {key!r} is not a POSIX shared-memory name: it must be one "
            "name, optionally after a leading '/', without any other '/' and without '..'"
        )
    return name


def open_object(key: str) -> int:
    """A descriptor of ``key``'s object in /dev/shm, read/write; the caller closes it.

    400 when there is no such object or it cannot be opened (a symbolic link is refused,
    not followed); 503 when this process has no descriptor left (EMFILE, ENFILE): that
    is the server's condition, not the client's mistake, and it may pass.
    """
    try:
        return open_name(object_name(key))
    except FileNotFoundError:
        raise InvalidInput(
            f"Unable to open shared memory region: no shared-memory object with key '{key}'"
        ) from None
    except OSError as exc:
        raise open_failure(key, exc) from None


def open_name(name: str) -> int:
    # NOTE: O_NOFOLLOW: a symbolic link in /dev/shm is refused, not followed.
    return os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_failure(key: str, exc: OSError) -> InvalidInput | Unavailable:
    if exc.errno in NO_DESCRIPTORS:
        return Unavailable(
            f"Unable to open shared memory region with key '{key}': the server has no file "
            f"descriptor left ({exc.strerror}); try again later",
            retry_after=1,
        )
    return InvalidInput(f"Unable to open shared memory region with key '{key}': {exc.strerror}")
