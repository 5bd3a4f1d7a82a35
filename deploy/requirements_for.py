"""Print the runtime requirements of oipserve for one image flavour, one per line.

pyproject.toml depends on onnxruntime-gpu (it runs on CPUs too, at 338 MiB installed).
The CPU image installs Microsoft's CPU build instead (the same ``onnxruntime`` import
package, 77 MiB); the CUDA image adds the ``cuda`` and ``cudnn``
extras, which bring NVIDIA's CUDA and cuDNN libraries as pip wheels.

Usage: python deploy/requirements_for.py cpu|cuda [pyproject.toml] > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

GPU_PACKAGE = re.compile(r"^onnxruntime-gpu(?=[\s<>=!~;\[]|$)")


def requirements(flavour: str, pyproject: Path) -> list[str]:
    with pyproject.open("rb") as file:
        dependencies: list[str] = tomllib.load(file)["project"]["dependencies"]
    replacement = {"cpu": "onnxruntime", "cuda": "onnxruntime-gpu[cuda,cudnn]"}[flavour]
    lines = [GPU_PACKAGE.sub(replacement, d) for d in dependencies]
    if not any(line.startswith(replacement.split("[")[0]) for line in lines):
        raise SystemExit(f"onnxruntime-gpu is not among {pyproject}'s dependencies")
    return lines


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("cpu", "cuda"):
        print(__doc__, file=sys.stderr)
        return 2
    pyproject = Path(argv[1]) if len(argv) > 1 else Path(__file__).parents[1] / "pyproject.toml"
    print("\n".join(requirements(argv[0], pyproject)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
