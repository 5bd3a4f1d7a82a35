"""``platform: "ensemble"`` configurations: what parses, what Triton refuses at parse, and the
load-time checks against the composing models (``check_against``)."""

from __future__ import annotations

import pytest

from oipserve.models.config.ensemble import EnsembleError, StepModel, check_against
from oipserve.models.config.parse import ModelConfigError, parse_model_config
from oipserve.models.ensemble import ensemble_cycle

HEAD = 'name: "e"\nplatform: "ensemble"\nmax_batch_size: 4\n'
X = 'input { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }\n'
Y = 'output { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }\n'


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f'input_map {{ key: "{k}" value: "{v}" }} ' for k, v in inputs.items())
    maps += "".join(f'output_map {{ key: "{k}" value: "{v}" }} ' for k, v in outputs.items())
    return f'step {{ model_name: "{model}" model_version: -1 {maps}}}\n'


def _config(*steps: str, extra: str = "", tensors: str = X + Y) -> str:
    return HEAD + tensors + "ensemble_scheduling {\n" + extra + "".join(steps) + "}\n"


def test_steps_are_put_in_dependency_order_with_their_readers() -> None:
    config = parse_model_config(
        _config(
            _step("plus", {"A": "l", "B": "r"}, {"OUT": "Y"}),
            _step("one", {"IN": "X"}, {"OUT": "l"}),
            _step("two", {"IN": "X"}, {"OUT": "r"}),
            extra="max_inflight_requests: 3\n",
        )
    )
    plan = config.ensemble
    assert plan is not None
    assert [s.model_name for s in plan.steps] == ["one", "two", "plus"]
    assert plan.consumers == ((2,), (2,), ())
    assert plan.max_inflight_requests == 3
    assert config.platform == "ensemble"


# (config text, a piece of the message)
REFUSED = [
    (HEAD + X + Y, "ensemble scheduling must be set for ensemble e whose platform is ensemble"),
    (
        'name: "m"\n' + "ensemble_scheduling { }",
        "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
    ),
    (
        HEAD.replace('platform: "ensemble"', 'platform: "ensemble" backend: "onnxruntime"')
        + "ensemble_scheduling { }",
        "Ensemble model 'e' must have platform type 'ensemble' and empty backend type",
    ),
    (_config(), "must specify 'step' for ensemble 'e'"),
    (
        _config(_step("m", {"IN": "X"}, {"OUT": "Y"}), extra="") + "instance_group { count: 1 }",
        "instance group should not be specified for ensemble 'e'",
    ),
    (_config('step { model_name: "m" output_map { key: "O" value: "Y" } }\n'), "'input_map'"),
    (
        _config(_step("m", {"IN": "X"}, {"O1": "Y", "O2": "Y"})),
        "ensemble tensor 'Y' can appear in an output map only once for ensemble 'e' step 0",
    ),
    (
        _config(_step("m", {"IN": "X"}, {"OUT": "Y"}), _step("n", {"IN": "X"}, {"OUT": "Y"})),
        "a tensor is mapped twice",
    ),
    (
        _config(_step("m", {"IN": "Y"}, {"OUT": "X"})),
        "ensemble tensor 'X' is an ensemble input and is also written by step 0",
    ),
    (
        _config(_step("m", {"IN": "Z"}, {"OUT": "Y"})),
        "ensemble input 'X' for ensemble e' is not used",
    ),
    (
        _config(_step("m", {"IN": "X"}, {"OUT": "Q"})),
        "output 'Y' for ensemble 'e' is not written",
    ),
    (
        _config(_step("m", {"IN": "X", "IN2": "nowhere"}, {"OUT": "Y"})),
        "reads ensemble tensor 'nowhere', which is neither an ensemble input nor written",
    ),
    (
        _config(_step("m", {"IN": "X"}, {"OUT": "Y", "EXTRA": "spare"})),
        "ensemble tensor 'spare' is unused in ensemble 'e'",
    ),
    (
        _config(
            _step("m", {"IN": "X", "B": "b"}, {"OUT": "a"}),
            _step("n", {"IN": "a"}, {"OUT": "b", "O2": "Y"}),
        ),
        "circular dependency in ensemble 'e': step 0 (m) -> step 1 (n) -> step 0 (m)",
    ),
    (
        _config(
            'step { model_name: "m" model_namespace: "ns" input_map { key: "I" value: "X" } '
            'output_map { key: "O" value: "Y" } }\n'
        ),
        "model_namespace: oipserve serves one repository namespace",
    ),
    (
        _config(_step("m", {"IN": "X"}, {"OUT": "Y"}))
        + "model_transaction_policy { decoupled: true }",
        "decoupled models are not supported",
    ),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_refused_at_parse(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(text)
    assert message in str(info.value)


def _model(name: str, mbs: int = 8, dtype: str = "FP32", dims: tuple[int, ...] = (-1, -1)):
    return StepModel(name, mbs, {"IN": (dtype, dims)}, {"OUT": (dtype, dims)})


def _check(models: dict[str, StepModel], text: str, own=(("X", "FP32", (-1, -1)),)) -> None:
    config = parse_model_config(text)
    assert config.ensemble is not None

    def lookup(step):  # noqa: ANN001, ANN202
        if step.model_name not in models:
            raise EnsembleError(f"unknown composing model '{step.model_name}'")
        return models[step.model_name]

    check_against(
        "e", config.max_batch_size, own, [("Y", "FP32", (-1, -1))], config.ensemble, lookup
    )


CHAIN = _config(_step("a", {"IN": "X"}, {"OUT": "t"}), _step("b", {"IN": "t"}, {"OUT": "Y"}))


def test_a_consistent_chain_passes() -> None:
    _check({"a": _model("a"), "b": _model("b")}, CHAIN)


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ({"a": _model("a")}, "unknown composing model 'b'"),
        (
            {"a": _model("a"), "b": _model("b", dtype="INT32")},
            "ensemble tensor t: inconsistent data type: TYPE_FP32 is inferred from model a while "
            "TYPE_INT32 is inferred from model b",
        ),
        (
            {"a": _model("a"), "b": _model("b", dims=(-1, 3, 2))},
            "ensemble tensor t: inconsistent shape: [-1, -1] is inferred from model a while "
            "[-1, 3, 2] is inferred from model b",
        ),
        (
            {"a": _model("a", mbs=2), "b": _model("b")},
            "ensemble e allows maximum batch size 4, but it contains model a which only allows "
            "maximum batch size to be 2",
        ),
        (
            {
                "a": StepModel("a", 8, {"OTHER": ("FP32", (-1, -1))}, {"OUT": ("FP32", (-1, -1))}),
                "b": _model("b"),
            },
            "ensemble tensor X is mapping to non-existing input IN in model a",
        ),
    ],
)
def test_refused_against_the_composing_models(models: dict[str, StepModel], message: str) -> None:
    with pytest.raises(EnsembleError) as info:
        _check(models, CHAIN)
    assert message in str(info.value)


def test_an_optional_input_may_be_left_unmapped() -> None:
    """As Triton's ValidateEnsembleConfig allows it (qa/L0_optional_input's pipeline);
    a required one is refused in its words."""
    inputs = {"IN": ("FP32", (-1, -1)), "EXTRA": ("FP32", (-1, -1))}
    outputs = {"OUT": ("FP32", (-1, -1))}
    optional = StepModel("b", 8, inputs, outputs, frozenset({"EXTRA"}))
    _check({"a": _model("a"), "b": optional}, CHAIN)
    with pytest.raises(EnsembleError) as info:
        _check({"a": _model("a"), "b": StepModel("b", 8, inputs, outputs)}, CHAIN)
    assert "in ensemble e, input EXTRA in model b is not mapped to any ensemble tensors" in str(
        info.value
    )


def test_encoded_images_may_feed_an_image_input() -> None:
    """BYTES into a 4-D numeric input: the step's worker decodes them (docs/images.md)."""
    image = StepModel("img", 8, {"IN": ("FP32", (-1, 4, 4, 3))}, {"OUT": ("FP32", (-1, -1))})
    _check({"a": image, "b": _model("b")}, CHAIN, own=(("X", "BYTES", (-1,)),))


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ({"e": ["e"]}, "circular dependency between ensembles: e -> ... -> e -> e"),
        (
            {"e": ["m", "f"], "f": ["m", "g"], "g": ["e"]},
            "circular dependency between ensembles: e -> ... -> g -> e",
        ),
        ({"e": ["f", "g"], "f": ["g", "m"], "g": ["m"]}, None),  # a diamond of ensembles
        ({"e": ["f"], "f": ["g"], "g": ["f"]}, None),  # a cycle below e: f's load refuses it
    ],
)
def test_an_ensemble_leading_back_to_itself_is_named(
    steps: dict[str, list[str]], message: str | None
) -> None:
    """Ensembles may be steps of ensembles (Triton's nested ensembles), never of themselves:
    Triton's ``circular dependency between ensembles`` message, naming the last one."""
    assert ensemble_cycle("e", steps["e"], lambda name: steps.get(name, [])) == message
