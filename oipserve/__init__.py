"""oipserve: an Open Inference Protocol (KServe v2) server for ONNX models."""

from importlib.metadata import PackageNotFoundError, version

try:
    #: From the installed package's metadata (pyproject.toml's ``version``): one source.
    __version__ = version("oipserve")
except PackageNotFoundError:  # pragma: no cover - a tree that was never installed
    __version__ = "0+unknown"
