"""A model's label files (``label_filename`` of a config output): read once, checked, bounded.

The classification extension (``oipserve.request.classification``) turns an output's top-k
class indices into these labels; they are read when the model's configuration is.
"""

from __future__ import annotations

from pathlib import Path

#: A label file larger than this is refused (ImageNet-21k's labels take about 500 KB).
LABELS_MAX_BYTES = 16 * 1024 * 1024


def read_labels(directory: Path, filename: str, where: str) -> tuple[str, ...]:
    """The labels of ``directory/filename``, one a line; ValueError naming ``where``.

    The file must lie inside the model's directory (no absolute path, no way out
    through ``..`` or a link), be UTF-8 and at most ``LABELS_MAX_BYTES``.
    """
    root = directory.resolve()
    path = (root / filename).resolve()
    if Path(filename).is_absolute() or not path.is_relative_to(root) or path == root:
        raise ValueError(f"{where}: label_filename {filename!r} must name a file inside {root}")
    try:
        with path.open("rb") as file:
            data = file.read(LABELS_MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{where}: cannot read label_filename {filename!r}: {exc}") from None
    if len(data) > LABELS_MAX_BYTES:
        raise ValueError(
            f"{where}: label_filename {filename!r} is larger than {LABELS_MAX_BYTES} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{where}: label_filename {filename!r} is not valid UTF-8 ({exc.reason} at byte "
            f"{exc.start})"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return tuple(line.removesuffix("\r") for line in lines)
