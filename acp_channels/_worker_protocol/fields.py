"""A message's fields to msgpack-able values and back, planned once per class from its type
hints: what the channel layer carries, checked on the way in (MalformedMessage)."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Union, get_args, get_origin, get_type_hints

from acp_channels._identity import Principal
from acp_channels._inventory import ConnectionInfo
from acp_channels._worker_protocol.messages import Op, Pushed, Reply


class MalformedMessage(ValueError):
    """A message (or a field of one) that does not follow this protocol."""


Encoder = Callable[[Any], Any]
Decoder = Callable[[Any], Any]


def _scalar(kind: type) -> tuple[Encoder, Decoder]:
    def decode(value: Any) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise MalformedMessage(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return (lambda value: value), decode


def _wire_value(kind: Any) -> tuple[Encoder, Decoder]:
    def decode(value: Any) -> Any:
        try:
            return kind.from_wire(value)
        except (KeyError, TypeError, ValueError) as error:
            raise MalformedMessage(f"not a {kind.__name__}: {error}") from None

    return (lambda value: value.to_wire()), decode


def _codec(hint: Any) -> tuple[Encoder, Decoder]:
    origin = get_origin(hint)
    if hint in (str, int, float, bool):
        return _scalar(hint)
    if hint in (Principal, ConnectionInfo):
        return _wire_value(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in get_args(hint) if arg is not type(None)]
        assert len(options) == 1, hint
        encode, decode = _codec(options[0])
        return (lambda value: None if value is None else encode(value)), (
            lambda value: None if value is None else decode(value)
        )
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item_encode, item_decode = _codec(args[0])

            def decode_many(value: Any) -> tuple[Any, ...]:
                if not isinstance(value, list | tuple):
                    raise MalformedMessage(f"expected a list, got {type(value).__name__}")
                return tuple(map(item_decode, value))

            if args[0] is str:  # the common, big case (a batch's items): no per-item call
                return list, lambda value: _strings(decode_many, value)
            return (lambda value: [item_encode(item) for item in value]), decode_many
        codecs = [_codec(arg) for arg in args]

        def decode_fixed(value: Any) -> tuple[Any, ...]:
            if not isinstance(value, list | tuple) or len(value) != len(codecs):
                raise MalformedMessage(f"expected {len(codecs)} values")
            return tuple(decode(item) for (_, decode), item in zip(codecs, value, strict=True))

        return (lambda value: [encode(item) for (encode, _), item in zip(codecs, value, strict=True)]), decode_fixed
    raise TypeError(f"no wire form for {hint!r}")


def _strings(decode_many: Callable[[Any], tuple[Any, ...]], value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple) and all(type(item) is str for item in value):
        return tuple(value)
    return decode_many(value)


FieldPlan = tuple[tuple[str, Encoder, Decoder, bool], ...]
_plans: dict[type, FieldPlan] = {}


def _plan(cls: type) -> FieldPlan:
    """(field, encoder, decoder, required) for each field of a message class."""
    plan = _plans.get(cls)
    if plan is None:
        plan = _plans[cls] = _make_plan(cls)
    return plan


def _make_plan(cls: type) -> FieldPlan:
    hints = get_type_hints(cls)
    plan = []
    for field in fields(cls):
        encode, decode = _codec(hints[field.name])
        required = field.default is field.default_factory  # both MISSING: no default
        plan.append((field.name, encode, decode, required))
    return tuple(plan)


def encode_fields(value: Op | Reply | Pushed) -> dict[str, Any]:
    return {name: encode(getattr(value, name)) for name, encode, _, _ in _plan(type(value))}


def decode_fields(cls: type[typing.Any], values: Any) -> Any:
    """An instance of `cls` from its fields; MalformedMessage when they do not fit."""
    if not isinstance(values, dict):
        raise MalformedMessage(f"{cls.name}: fields are not a mapping")
    known = set()
    arguments = {}
    for name, _, decode, required in _plan(cls):
        known.add(name)
        if name in values:
            try:
                arguments[name] = decode(values[name])
            except MalformedMessage as error:
                raise MalformedMessage(f"{cls.name}.{name}: {error}") from None
        elif required:
            raise MalformedMessage(f"{cls.name}: {name} is missing")
    return cls(**arguments)


def describe(reply: Reply) -> str:
    shown = ", ".join(f"{name}={getattr(reply, name)!r}" for name, *_ in _plan(type(reply)))
    return f"{reply.name}({shown})" if shown else reply.name
