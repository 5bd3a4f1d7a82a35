"""Repositories of the sample encoder (model-repository/build.py) for padded batching.

``write_padded_repository`` writes, all from the same ONNX graph:

- ``encoder``: the sample config (the client sends input_ids and attention_mask, both
  padded), with preferred batch size 4 and a long queue delay, so that four requests of
  different lengths run as one execution of 4 as soon as the fourth arrives;
- ``encoder_mask``: the server makes attention_mask (``mask attention_mask``): the config
  lists only input_ids;
- ``encoder_waste``: preferred size 4, a short delay and ``waste 2``, to see a long request
  start its own batch;
- ``encoder_alone``: no batching at all (each request alone: the reference);
- one model per entry of ``MALFORMED``, each refused at load with the reason given.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np

BUILD_PY = Path(__file__).resolve().parents[2] / "model-repository" / "build.py"

#: pad_batch values refused at load, and a part of each reason.
MALFORMED = {
    "pad_unknown_input": ("input nope dim 1 pad 0", "pad_batch input 'nope' is not a configured"),
    "pad_fixed_dim": ("input input_ids dim 2 pad 0", "dim 2 is not one of its dimensions"),
    "pad_bad_value": ("input input_ids dim 1 pad 0.5", "is not a whole number, as INT64"),
    "pad_bad_clause": ("input input_ids dim 1 pad 0; trim hidden", "unknown clause 'trim'"),
    "pad_bad_output": (
        "input input_ids dim 1 pad 0; output pooled dim 1",
        "dim 1 has the fixed size 64",
    ),
    "pad_bad_waste": ("input input_ids dim 1 pad 0; waste 0.5", "'waste' needs one number"),
    "pad_mask_listed": (
        "input input_ids dim 1 pad 0 mask attention_mask",
        "mask target 'attention_mask' is a configured input",
    ),
}


def load_build() -> ModuleType:
    """model-repository/build.py, imported from its path (it is a script)."""
    spec = importlib.util.spec_from_file_location("model_repository_build_padded", BUILD_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batching(config: str, batching: str) -> str:
    old = "dynamic_batching { max_queue_delay_microseconds: 2000 }"
    assert old in config
    return config.replace(old, batching)


def write_padded_repository(root: Path, delay_us: int, short_delay_us: int) -> None:
    """The models described above, under ``root``."""
    build = load_build()
    forced = (
        "dynamic_batching { preferred_batch_size: [ 4 ] "
        f"max_queue_delay_microseconds: {delay_us} }}"
    )
    short = (
        "dynamic_batching { preferred_batch_size: [ 4 ] "
        f"max_queue_delay_microseconds: {short_delay_us} }}"
    )
    build.build_encoder(root)
    config = root / "encoder" / "config.pbtxt"
    config.write_text(_batching(config.read_text(), forced))
    build.build_encoder(root, "encoder_waste", build.ENCODER_PAD_BATCH + "; waste 2")
    config = root / "encoder_waste" / "config.pbtxt"
    config.write_text(_batching(config.read_text(), short))
    build.build_encoder(root, "encoder_alone", None)
    config = root / "encoder_alone" / "config.pbtxt"
    config.write_text(_batching(config.read_text(), ""))
    mask = "input input_ids dim 1 pad 0 mask attention_mask; output hidden dim 1"
    build.build_encoder(root, "encoder_mask", mask)
    config = root / "encoder_mask" / "config.pbtxt"
    text = _batching(config.read_text(), forced)
    text = text.replace(
        '  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },\n'
        '  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }\n',
        '  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }\n',
    )
    config.write_text(text)
    for name, (value, _) in MALFORMED.items():
        build.build_encoder(root, name, value)


def tokens(seed: int, lengths: list[int]) -> list[np.ndarray]:
    """input_ids of one row each, of the given lengths."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 100, (1, n)).astype(np.int64) for n in lengths]
