"""The values the Python layer accepts for the C API's fields, checked before anything reaches C.

Python would coerce silently where C has exact rules (int(bool("False")) is 1, int(2.7) is 2,
a -1 for a C flag would become True): every keyword and argument that becomes a C field goes
through one of these, which accept exactly the documented values and types and raise naming
the key, the value and what is allowed. A value of the wrong type raises TypeError; a value of
the right type outside what is allowed raises co2.InvalidArgumentError (a ValueError, the class
the C API's own refusal of a field raises), an unknown enum name co2.UnknownEnumError. Ranges
the C API checks itself (tau >= 1, outer_momentum in [0, 1), ...) are left to it: it names them
too.
"""
from __future__ import annotations

import numbers
from typing import Mapping

import numpy as np

from ._errors import InvalidArgumentError, UnknownEnumError

UINT32_MAX = 2 ** 32 - 1
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _describe(what: str, value: object) -> str:
    return f"{what}={value!r} ({type(value).__name__})"


def _wrong(value: object) -> type[Exception]:
    """The class to raise for a refused value: its type was right (an integer) or not."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    return InvalidArgumentError if integral else TypeError


def flag(what: str, value: object) -> int:
    """A C flag (0 / 1): True or False (also numpy's), or the C values 0 and 1."""
    if isinstance(value, (bool, np.bool_)):
        return int(bool(value))
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return int(value)
    raise _wrong(value)(f"{_describe(what, value)}: {what} is True or False (or the C values "
                        f"1 / 0)")


def tristate(what: str, value: object, auto_name: str, auto_value: int) -> int:
    """A C flag with an automatic choice: True, False, `auto_name` or the C values 1, 0 and
    `auto_value`."""
    allowed = (f"{what} is True, False or {auto_name!r} (or the C values 1, 0, "
               f"{auto_value})")
    if isinstance(value, str):
        if value == auto_name:
            return auto_value
        raise InvalidArgumentError(f"{_describe(what, value)}: {allowed}")
    if isinstance(value, (bool, np.bool_)):
        return int(bool(value))
    if isinstance(value, numbers.Integral) and int(value) in (0, 1, auto_value):
        return int(value)
    raise _wrong(value)(f"{_describe(what, value)}: {allowed}")


def integer(what: str, value: object, low: int, high: int) -> int:
    """A whole number in [low, high]: int or numpy integer, not bool, float or str."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{_describe(what, value)}: {what} is an integer in [{low}, {high}]")
    if not low <= int(value) <= high:
        raise InvalidArgumentError(f"{_describe(what, value)}: {what} is an integer in "
                                   f"[{low}, {high}]")
    return int(value)


def number(what: str, value: object) -> float:
    """A real number: int, float or a numpy scalar, not bool or str."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{_describe(what, value)}: {what} is a number")
    return float(value)


def choice(table: Mapping[str, int], value: object, what: str) -> int:
    """An enum: one of the table's names (any case) or a C constant (an int; the C API names
    an unknown one)."""
    if isinstance(value, str):
        try:
            return table[value.lower()]
        except KeyError:
            raise UnknownEnumError(f"unknown {what} {value!r}; one of {', '.join(table)}") \
                from None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{_describe(what, value)}: {what} is one of {', '.join(table)} (or "
                        f"its C constant, an int)")
    return integer(what, value, INT32_MIN, INT32_MAX)
