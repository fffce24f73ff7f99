"""Go's CPU profiles (pprof's gzipped protobuf), read without Go's tools.

nats-server serves its CPU profile at ``/debug/pprof/profile?seconds=N`` when it is
started with a ``prof_port``. Go samples by CPU time (a signal every 10 ms of a
thread's CPU), so unlike py-spy's samples these are the process's CPU itself, not a
share of its threads' time on or waiting for a core.

Only what a summary needs is read: each sample's stack of function names (innermost
first) and its CPU nanoseconds. The message layout is pprof's ``profile.proto``.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass

# Field numbers in profile.proto.
_PROFILE_SAMPLE_TYPE = 1
_PROFILE_SAMPLE = 2
_PROFILE_LOCATION = 4
_PROFILE_FUNCTION = 5
_PROFILE_STRINGS = 6
_SAMPLE_LOCATIONS = 1
_SAMPLE_VALUES = 2
_VALUE_TYPE_TYPE = 1
_LOCATION_ID = 1
_LOCATION_LINE = 4
_LINE_FUNCTION = 1
_FUNCTION_ID = 1
_FUNCTION_NAME = 2

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of one message."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            value, at = _varint(data, at)
            yield number, value
        elif kind == _BYTES:
            size, at = _varint(data, at)
            yield number, data[at : at + size]
            at += size
        elif kind == _FIXED64:
            yield number, int.from_bytes(data[at : at + 8], "little")
            at += 8
        elif kind == _FIXED32:
            yield number, int.from_bytes(data[at : at + 4], "little")
            at += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {kind}")


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field's values, packed (bytes) or one by one."""
    if isinstance(value, int):
        return [value]
    out: list[int] = []
    at = 0
    while at < len(value):
        one, at = _varint(value, at)
        out.append(one)
    return out


@dataclass(frozen=True)
class Sample:
    #: Function names, innermost first (inlined frames included, as pprof lists them).
    stack: tuple[str, ...]
    #: CPU nanoseconds the sample stands for.
    cpu_ns: int


def read(raw: bytes) -> list[Sample]:
    """The samples of one CPU profile as nats-server (any Go program) serves it."""
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    strings: list[str] = []
    value_types: list[int] = []
    raw_samples: list[tuple[list[int], list[int]]] = []
    locations: dict[int, list[int]] = {}
    functions: dict[int, int] = {}
    for number, value in _fields(data):
        if number == _PROFILE_STRINGS and isinstance(value, bytes):
            strings.append(value.decode("utf-8", "replace"))
        elif number == _PROFILE_SAMPLE_TYPE and isinstance(value, bytes):
            for n, v in _fields(value):
                if n == _VALUE_TYPE_TYPE and isinstance(v, int):
                    value_types.append(v)
        elif number == _PROFILE_SAMPLE and isinstance(value, bytes):
            ids: list[int] = []
            values: list[int] = []
            for n, v in _fields(value):
                if n == _SAMPLE_LOCATIONS:
                    ids.extend(_ints(v))
                elif n == _SAMPLE_VALUES:
                    values.extend(_ints(v))
            raw_samples.append((ids, values))
        elif number == _PROFILE_LOCATION and isinstance(value, bytes):
            location_id, lines = 0, []
            for n, v in _fields(value):
                if n == _LOCATION_ID and isinstance(v, int):
                    location_id = v
                elif n == _LOCATION_LINE and isinstance(v, bytes):
                    for ln, lv in _fields(v):
                        if ln == _LINE_FUNCTION and isinstance(lv, int):
                            lines.append(lv)
            locations[location_id] = lines
        elif number == _PROFILE_FUNCTION and isinstance(value, bytes):
            function_id, name = 0, 0
            for n, v in _fields(value):
                if n == _FUNCTION_ID and isinstance(v, int):
                    function_id = v
                elif n == _FUNCTION_NAME and isinstance(v, int):
                    name = v
            functions[function_id] = name
    # Go's CPU profile has two values a sample: a count and nanoseconds ("cpu").
    types = [strings[t] if t < len(strings) else "" for t in value_types]
    column = types.index("cpu") if "cpu" in types else len(types) - 1
    samples: list[Sample] = []
    for ids, values in raw_samples:
        stack = tuple(
            strings[functions.get(function, 0)]
            for location in ids
            for function in locations.get(location, ())
        )
        samples.append(Sample(stack, values[column] if 0 <= column < len(values) else 0))
    return samples
