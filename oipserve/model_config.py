"""Reader for Triton `config.pbtxt` model configurations (protobuf text format).

Dependency-free on purpose: pulling in protobuf plus Triton's generated classes just to read a
handful of fields is heavy. The parser is strict so a typo fails loudly at load time (with a
line and column) instead of silently changing how a model is served. Fields Triton knows but
this server does not use are syntax-checked and kept in `ModelConfig.extra`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from oipserve.wire.datatypes import BY_TRITON

__all__ = [
    "InstanceGroup",
    "ModelConfig",
    "ModelConfigError",
    "TensorConfig",
    "parse_model_config",
    "read_model_config",
]


INSTANCE_KINDS = frozenset({"KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"})

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class ModelConfigError(ValueError):
    """A config.pbtxt that is not valid text format or not a valid Triton model config."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        prefix = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(prefix + message)


class TensorConfig(msgspec.Struct, frozen=True):
    """One `input`/`output` entry; `data_type` is the OIP datatype (e.g. "FP32", "BYTES")."""

    name: str
    data_type: str
    dims: tuple[int, ...]


class InstanceGroup(msgspec.Struct, frozen=True):
    """One `instance_group` entry."""

    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] = ()


class ModelConfig(msgspec.Struct, frozen=True):
    """The parts of a Triton model configuration this server uses.

    `extra` holds the other top-level fields Triton accepts, as plain Python values: a message
    becomes a dict; a repeated top-level field (e.g. `model_warmup`) is always a list, and a
    nested field is a list when given more than once or with `[...]`.
    """

    name: str | None = None
    platform: str | None = None
    backend: str | None = None
    max_batch_size: int = 0
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    instance_groups: tuple[InstanceGroup, ...] = ()
    parameters: dict[str, str] = msgspec.field(default_factory=dict)
    default_model_filename: str | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


# --------------------------------------------------------------------------- tokenizer

# Token kinds; the values double as the wording of error messages.
_IDENT, _STRING, _INT, _FLOAT = "identifier", "string", "int", "float"
_SYMBOL, _EOF = "symbol", "EOF"

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\n\f\v]+|\#[^\n]*)
    | (?P<float>-?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?
               |-?[0-9]+(?:[eE][+-]?[0-9]+[fF]?|[fF]))
    | (?P<int>-?(?:0[xX][0-9a-fA-F]+|[0-9]+))
    | (?P<neg_ident>-[A-Za-z_][A-Za-z0-9_]*)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<quote>["'])
    | (?P<symbol>[{}\[\]<>:,;])
    """,
    re.VERBOSE,
)
_IDENT_CHAR = re.compile(r"[A-Za-z0-9_.]")
_SIMPLE_ESCAPES = {
    "n": b"\n",
    "t": b"\t",
    "r": b"\r",
    "a": b"\a",
    "b": b"\b",
    "f": b"\f",
    "v": b"\v",
    "\\": b"\\",
    "'": b"'",
    '"': b'"',
    "?": b"?",
}
_NON_FINITE = {"inf": "inf", "infinity": "inf", "nan": "nan"}


class _Token(msgspec.Struct, frozen=True):
    kind: str
    value: Any
    text: str
    line: int
    column: int


def _describe(token: _Token) -> str:
    return "end of input" if token.kind == _EOF else repr(token.text)


class _Tokenizer:
    """Splits text into tokens, tracking line and column (both 1-based) for error messages."""

    def __init__(self, text: str):
        self._text = text
        self._pos = 0
        self._line = 1
        self._line_start = 0

    def _fail(self, message: str, pos: int) -> NoReturn:
        line = self._text.count("\n", 0, pos) + 1
        column = pos - (self._text.rfind("\n", 0, pos) + 1) + 1
        raise ModelConfigError(message, line, column)

    def tokens(self) -> list[_Token]:
        text = self._text
        out: list[_Token] = []
        while True:
            pos = self._pos
            if pos >= len(text):
                out.append(self._token(_EOF, None, "", pos))
                return out
            match = _TOKEN_RE.match(text, pos)
            if match is None:
                self._fail(f"unexpected character {text[pos]!r}", pos)
            group = match.lastgroup
            end = match.end()
            raw = match.group()
            if group == "ws":
                self._advance(end)
                continue
            if group == "quote":
                out.append(self._string(pos))
                continue
            if group in ("float", "int", "ident", "neg_ident") and end < len(text):
                if _IDENT_CHAR.match(text, end):
                    self._fail(f"invalid token starting {raw!r}", pos)
            if group == "float":
                out.append(self._token(_FLOAT, float(raw.rstrip("fF")), raw, pos))
            elif group == "int":
                try:
                    value = _parse_int(raw)
                except ValueError:
                    self._fail(f"invalid integer literal {raw!r}", pos)
                out.append(self._token(_INT, value, raw, pos))
            elif group == "neg_ident":
                if raw[1:].lower() not in _NON_FINITE:
                    self._fail(f"expected a number after '-', got {raw[1:]!r}", pos)
                out.append(self._token(_FLOAT, -float(_NON_FINITE[raw[1:].lower()]), raw, pos))
            elif group == "ident":
                out.append(self._token(_IDENT, raw, raw, pos))
            else:
                out.append(self._token(_SYMBOL, raw, raw, pos))
            self._advance(end)

    def _token(self, kind: str, value: Any, raw: str, pos: int) -> _Token:
        return _Token(kind, value, raw, self._line, pos - self._line_start + 1)

    def _advance(self, end: int) -> None:
        newlines = self._text.count("\n", self._pos, end)
        if newlines:
            self._line += newlines
            self._line_start = self._text.rfind("\n", self._pos, end) + 1
        self._pos = end

    def _string(self, start: int) -> _Token:
        """Quoted string with C-style escapes; escapes yield bytes, decoded as UTF-8 at the end."""
        text = self._text
        quote = text[start]
        buf = bytearray()
        i = start + 1
        while True:
            if i >= len(text) or text[i] == "\n":
                self._fail("unterminated string", start)
            ch = text[i]
            if ch == quote:
                i += 1
                break
            if ch != "\\":
                buf += ch.encode("utf-8", "surrogatepass")
                i += 1
                continue
            if i + 1 >= len(text):
                self._fail("unterminated string", start)
            esc = text[i + 1]
            if esc in _SIMPLE_ESCAPES:
                buf += _SIMPLE_ESCAPES[esc]
                i += 2
            elif esc in "01234567":
                digits = re.match(r"[0-7]{1,3}", text[i + 1 : i + 4])
                assert digits is not None
                value = int(digits.group(), 8)
                if value > 0xFF:
                    self._fail(f"octal escape out of range: \\{digits.group()}", i)
                buf.append(value)
                i += 1 + len(digits.group())
            elif esc in "xX":
                digits = re.match(r"[0-9a-fA-F]{1,2}", text[i + 2 : i + 4])
                if digits is None:
                    self._fail("\\x escape needs hex digits", i)
                buf.append(int(digits.group(), 16))
                i += 2 + len(digits.group())
            elif esc in "uU":
                width = 4 if esc == "u" else 8
                digits = re.fullmatch(r"[0-9a-fA-F]+", text[i + 2 : i + 2 + width])
                if digits is None or len(digits.group()) != width:
                    self._fail(f"\\{esc} escape needs {width} hex digits", i)
                code = int(digits.group(), 16)
                if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                    self._fail(f"invalid code point in escape: U+{code:X}", i)
                buf += chr(code).encode("utf-8")
                i += 2 + width
            else:
                self._fail(f"unknown escape sequence \\{esc}", i)
        try:
            value = buf.decode("utf-8")
        except UnicodeDecodeError:
            self._fail("string is not valid UTF-8", start)
        token = self._token(_STRING, value, text[start:i], start)
        self._advance(i)
        return token


def _parse_int(raw: str) -> int:
    """Protobuf integer literal: decimal, 0x hex or leading-zero octal; ValueError if bad."""
    sign, digits = (-1, raw[1:]) if raw.startswith("-") else (1, raw)
    if digits[:2] in ("0x", "0X"):
        return sign * int(digits[2:], 16)
    if len(digits) > 1 and digits[0] == "0":
        return sign * int(digits, 8)  # ValueError for e.g. "09", as in protobuf
    return sign * int(digits)


# --------------------------------------------------------------------------- parser


class _Message(msgspec.Struct, frozen=True):
    fields: tuple[_Field, ...]
    line: int
    column: int


class _Field(msgspec.Struct, frozen=True):
    name: str
    value: _Token | _Message | None  # None: the field was written as an empty list `[]`
    line: int
    column: int
    in_list: bool  # written as `name: [ ... ]`


_CLOSERS = {"{": "}", "<": ">"}


class _Parser:
    """Recursive descent over the token list, producing an untyped `_Message` tree."""

    def __init__(self, tokens: list[_Token]):
        self._tokens = tokens
        self._i = 0

    def _peek(self) -> _Token:
        return self._tokens[self._i]

    def _next(self) -> _Token:
        token = self._tokens[self._i]
        if token.kind != _EOF:
            self._i += 1
        return token

    def _is(self, symbol: str) -> bool:
        token = self._peek()
        return token.kind == _SYMBOL and token.value == symbol

    @staticmethod
    def _fail(message: str, token: _Token) -> NoReturn:
        raise ModelConfigError(message, token.line, token.column)

    def parse(self) -> _Message:
        return self._message(None, self._peek())

    def _message(self, closer: str | None, opener: _Token) -> _Message:
        fields: list[_Field] = []
        while True:
            token = self._peek()
            if token.kind == _EOF:
                if closer is None:
                    return _Message(tuple(fields), opener.line, opener.column)
                self._fail(
                    f"expected {closer!r} to close {opener.text!r} opened at line "
                    f"{opener.line}, column {opener.column}, got end of input",
                    token,
                )
            if closer is not None and self._is(closer):
                self._next()
                return _Message(tuple(fields), opener.line, opener.column)
            fields.extend(self._field())
            if self._is(",") or self._is(";"):
                self._next()

    def _field(self) -> list[_Field]:
        name = self._next()
        if name.kind != _IDENT:
            self._fail(f"expected a field name, got {_describe(name)}", name)
        has_colon = self._is(":")
        if has_colon:
            self._next()
        token = self._peek()
        if token.kind == _SYMBOL and token.value in _CLOSERS:
            value = self._message(_CLOSERS[self._next().value], token)
            return [_Field(name.value, value, name.line, name.column, False)]
        if self._is("["):
            self._next()
            values: list[_Token | _Message | None] = list(self._list())
            # An empty list still marks the field as present (e.g. `dims: []` for a scalar).
            return [
                _Field(name.value, value, name.line, name.column, True)
                for value in values or [None]
            ]
        if not has_colon:
            self._fail(
                f"expected ':' or '{{' after field name {name.value!r}, got {_describe(token)}",
                token,
            )
        return [_Field(name.value, self._scalar(name.value), name.line, name.column, False)]

    def _list(self) -> list[_Token | _Message]:
        values: list[_Token | _Message] = []
        if self._is("]"):
            self._next()
            return values
        while True:
            token = self._peek()
            if token.kind == _SYMBOL and token.value in _CLOSERS:
                values.append(self._message(_CLOSERS[self._next().value], token))
            else:
                values.append(self._scalar(None))
            separator = self._next()
            if separator.kind == _SYMBOL and separator.value == "]":
                return values
            if separator.kind != _SYMBOL or separator.value != ",":
                self._fail(f"expected ',' or ']' in list, got {_describe(separator)}", separator)

    def _scalar(self, field: str | None) -> _Token:
        token = self._next()
        if token.kind in (_INT, _FLOAT, _IDENT):
            return token
        if token.kind == _STRING:
            # Adjacent string literals concatenate, as in protobuf (and C).
            parts = [token.value]
            while self._peek().kind == _STRING:
                parts.append(self._next().value)
            if len(parts) == 1:
                return token
            return _Token(_STRING, "".join(parts), token.text, token.line, token.column)
        where = f" for field {field!r}" if field else ""
        self._fail(f"expected a value{where}, got {_describe(token)}", token)


# --------------------------------------------------------------------------- conversion

_MODEL_CONFIG_FIELDS = {
    # name: repeated?
    "name": False,
    "platform": False,
    "backend": False,
    "runtime": False,
    "version_policy": False,
    "max_batch_size": False,
    "input": True,
    "output": True,
    "batch_input": True,
    "batch_output": True,
    "optimization": False,
    "dynamic_batching": False,
    "sequence_batching": False,
    "ensemble_scheduling": False,
    "instance_group": True,
    "default_model_filename": False,
    "cc_model_filenames": True,
    "metric_tags": True,
    "parameters": True,
    "model_warmup": True,
    "model_operations": False,
    "model_transaction_policy": False,
    "model_repository_agents": False,
    "response_cache": False,
    "model_metrics": False,
}
_USED_FIELDS = frozenset(
    {
        "name",
        "platform",
        "backend",
        "max_batch_size",
        "input",
        "output",
        "instance_group",
        "parameters",
        "default_model_filename",
    }
)
_SCHEDULING_ONEOF = ("dynamic_batching", "sequence_batching", "ensemble_scheduling")
_INPUT_FIELDS = {
    "name": False,
    "data_type": False,
    "format": False,
    "dims": True,
    "reshape": False,
    "is_shape_tensor": False,
    "allow_ragged_batch": False,
    "optional": False,
    "is_non_linear_format_io": False,
}
_OUTPUT_FIELDS = {
    "name": False,
    "data_type": False,
    "dims": True,
    "reshape": False,
    "label_filename": False,
    "is_shape_tensor": False,
    "is_non_linear_format_io": False,
}
_INSTANCE_GROUP_FIELDS = {
    "name": False,
    "kind": False,
    "count": False,
    "rate_limiter": False,
    "gpus": True,
    "secondary_devices": True,
    "profile": True,
    "passive": False,
    "host_policy": False,
}
_PARAMETER_FIELDS = {"key": False, "value": False}
_PARAMETER_VALUE_FIELDS = {"string_value": False}


def _fail_at(item: _Field | _Message | _Token, message: str) -> NoReturn:
    raise ModelConfigError(message, item.line, item.column)


def _group(msg: _Message, where: str, schema: dict[str, bool]) -> dict[str, list[_Field]]:
    """Group fields by name, rejecting unknown names and repeats of singular fields."""
    groups: dict[str, list[_Field]] = {}
    for field in msg.fields:
        path = f"{where}.{field.name}" if where else field.name
        repeated = schema.get(field.name)
        if repeated is None:
            _fail_at(field, f"unknown field {path!r}")
        if not repeated and field.in_list:
            _fail_at(field, f"{path} is not a repeated field; '[...]' is not allowed")
        if not repeated and field.name in groups:
            _fail_at(field, f"{path} is specified more than once")
        groups.setdefault(field.name, []).append(field)
    return groups


def _present(fields: list[_Field]) -> list[_Field]:
    """Entries of a repeated field, without the placeholder an empty `[]` leaves."""
    return [field for field in fields if field.value is not None]


def _message_of(field: _Field, path: str) -> _Message:
    if not isinstance(field.value, _Message):
        got = "[]" if field.value is None else field.value.text
        _fail_at(field, f"{path} must be a message '{{ ... }}', got {got!r}")
    return field.value


def _token_of(field: _Field, path: str) -> _Token:
    if not isinstance(field.value, _Token):
        _fail_at(field, f"{path} must be a value, not a message")
    return field.value


def _string(field: _Field, path: str) -> str:
    token = _token_of(field, path)
    if token.kind != _STRING:
        _fail_at(token, f"{path} must be a quoted string, got {token.text!r}")
    return str(token.value)


def _integer(field: _Field, path: str, low: int, high: int) -> int:
    token = _token_of(field, path)
    if token.kind != _INT:
        _fail_at(token, f"{path} must be an integer, got {token.text!r}")
    value = int(token.value)
    if not low <= value <= high:
        _fail_at(token, f"{path} out of range: {value}")
    return value


def _enum(field: _Field, path: str) -> tuple[str, _Token]:
    token = _token_of(field, path)
    if token.kind != _IDENT:
        _fail_at(token, f"{path} must be an enum name, got {token.text!r}")
    return str(token.value), token


def _to_python(value: _Token | _Message) -> Any:
    """Plain Python form of an ignored field, for `ModelConfig.extra`."""
    if isinstance(value, _Token):
        if value.kind == _IDENT and value.value in ("true", "false"):
            return value.value == "true"
        return value.value
    return _fields_to_python(value.fields)


def _fields_to_python(
    fields: Iterable[_Field], schema: dict[str, bool] | None = None
) -> dict[str, Any]:
    """Fields as a dict; lists for fields the schema says are repeated (else: seen >1 or [...])."""
    grouped: dict[str, list[_Field]] = {}
    for field in fields:
        grouped.setdefault(field.name, []).append(field)
    out: dict[str, Any] = {}
    for name, items in grouped.items():
        value = items[0].value
        repeated = (schema or {}).get(name, False)
        if len(items) == 1 and not items[0].in_list and value is not None and not repeated:
            out[name] = _to_python(value)
        else:
            out[name] = [_to_python(item.value) for item in items if item.value is not None]
    return out


def _tensor(msg: _Message, path: str, schema: dict[str, bool]) -> TensorConfig:
    fields = _group(msg, path, schema)
    if "name" not in fields:
        _fail_at(msg, f"{path}.name is required")
    name = _string(fields["name"][0], f"{path}.name")
    if not name:
        _fail_at(fields["name"][0], f"{path}.name must not be empty")
    path = f"{path} ({name!r})"
    if "data_type" not in fields:
        _fail_at(msg, f"{path}.data_type is required")
    triton_type, token = _enum(fields["data_type"][0], f"{path}.data_type")
    if triton_type not in BY_TRITON:
        _fail_at(token, f"{path}.data_type: unknown data type {triton_type!r}")
    if "dims" not in fields:
        _fail_at(msg, f"{path}.dims is required")
    dims: list[int] = []
    for field in _present(fields["dims"]):
        dim = _integer(field, f"{path}.dims", _INT64_MIN, _INT64_MAX)
        if dim < 1 and dim != -1:
            _fail_at(field.value, f"{path}.dims: {dim} is invalid, use -1 or a positive size")
        dims.append(dim)
    return TensorConfig(name=name, data_type=BY_TRITON[triton_type].name, dims=tuple(dims))


def _instance_group(msg: _Message, path: str) -> InstanceGroup:
    fields = _group(msg, path, _INSTANCE_GROUP_FIELDS)
    count = 1
    if "count" in fields:
        count = _integer(fields["count"][0], f"{path}.count", _INT32_MIN, _INT32_MAX)
        if count < 1:
            _fail_at(fields["count"][0], f"{path}.count must be at least 1, got {count}")
    kind = "KIND_AUTO"
    if "kind" in fields:
        kind, token = _enum(fields["kind"][0], f"{path}.kind")
        if kind not in INSTANCE_KINDS:
            allowed = ", ".join(sorted(INSTANCE_KINDS))
            _fail_at(token, f"{path}.kind: unknown kind {kind!r} (expected one of {allowed})")
    gpus = tuple(
        _integer(field, f"{path}.gpus", 0, _INT32_MAX) for field in _present(fields.get("gpus", []))
    )
    if gpus and kind in ("KIND_CPU", "KIND_MODEL"):
        _fail_at(fields["gpus"][0], f"{path}.gpus cannot be given with {kind}")
    return InstanceGroup(count=count, kind=kind, gpus=gpus)


def _parameters(entries: list[_Field]) -> dict[str, str]:
    params: dict[str, str] = {}
    for field in _present(entries):
        path = "parameters"
        msg = _message_of(field, path)
        fields = _group(msg, path, _PARAMETER_FIELDS)
        if "key" not in fields:
            _fail_at(msg, f"{path}.key is required")
        key = _string(fields["key"][0], f"{path}.key")
        path = f"parameters[{key!r}]"
        if key in params:
            _fail_at(fields["key"][0], f"{path} is specified more than once")
        value = ""
        if "value" in fields:
            value_msg = _message_of(fields["value"][0], f"{path}.value")
            value_fields = _group(value_msg, f"{path}.value", _PARAMETER_VALUE_FIELDS)
            if "string_value" in value_fields:
                value = _string(value_fields["string_value"][0], f"{path}.value.string_value")
        params[key] = value
    return params


def _model_config(root: _Message) -> ModelConfig:
    fields = _group(root, "", _MODEL_CONFIG_FIELDS)
    given = [name for name in _SCHEDULING_ONEOF if name in fields]
    if len(given) > 1:
        _fail_at(fields[given[1]][0], f"only one of {', '.join(given)} may be given")
    kwargs: dict[str, Any] = {}
    for key in ("name", "platform", "backend", "default_model_filename"):
        if key in fields:
            kwargs[key] = _string(fields[key][0], key)
    if "max_batch_size" in fields:
        kwargs["max_batch_size"] = _integer(
            fields["max_batch_size"][0], "max_batch_size", 0, _INT32_MAX
        )
    for key, attr, schema in (
        ("input", "inputs", _INPUT_FIELDS),
        ("output", "outputs", _OUTPUT_FIELDS),
    ):
        entries = _present(fields.get(key, []))
        tensors = [
            _tensor(_message_of(field, f"{key}[{i}]"), f"{key}[{i}]", schema)
            for i, field in enumerate(entries)
        ]
        seen: set[str] = set()
        for field, tensor in zip(entries, tensors, strict=True):
            if tensor.name in seen:
                _fail_at(field, f"{key} {tensor.name!r} is specified more than once")
            seen.add(tensor.name)
        kwargs[attr] = tuple(tensors)
    kwargs["instance_groups"] = tuple(
        _instance_group(_message_of(field, f"instance_group[{i}]"), f"instance_group[{i}]")
        for i, field in enumerate(_present(fields.get("instance_group", [])))
    )
    kwargs["parameters"] = _parameters(fields.get("parameters", []))
    kwargs["extra"] = _fields_to_python(
        (field for field in root.fields if field.name not in _USED_FIELDS), _MODEL_CONFIG_FIELDS
    )
    return ModelConfig(**kwargs)


# --------------------------------------------------------------------------- public API


def parse_model_config(text: str) -> ModelConfig:
    """Parse the text of a Triton config.pbtxt; raise ModelConfigError if it is invalid."""
    tokens = _Tokenizer(text).tokens()
    return _model_config(_Parser(tokens).parse())


def read_model_config(path: Path) -> ModelConfig:
    """Read and parse a config.pbtxt file; errors name the file. OSError passes through."""
    data = Path(path).read_bytes()
    try:
        return parse_model_config(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        message = f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
        raise ModelConfigError(message) from exc
    except ModelConfigError as exc:
        located = ModelConfigError(f"{path}: {exc}")
        located.line, located.column = exc.line, exc.column
        raise located from exc
