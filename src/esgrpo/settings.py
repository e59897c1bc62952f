"""Trainer settings as dataclasses: building them from a config mapping and checking their fields.

ESConfig (`esgrpo.es.settings`) and GRPOSettings (`esgrpo.grpo.settings`) share these so every bad
value is reported the same way: the class, the field, what is allowed and what was given.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import numpy as np


def dataclass_from_dict(cls, d: Mapping[str, Any], label: str):
    """Build settings dataclass `cls` from a config mapping; unknown keys are an error, not ignored."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{label} settings must be a mapping, got {type(d).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {label} setting(s) {unknown}; allowed: {sorted(known)}")
    return cls(**dict(d))


class SettingsDataclass:
    """What a trainer's settings dataclass shares: from/to a config mapping, and the settings that
    decide the trajectory (all but `NOT_FINGERPRINTED`: those a run may change and still resume)."""

    LABEL: ClassVar[str] = "settings"
    NOT_FINGERPRINTED: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """Build from a plain mapping (a config section); unknown keys are an error, not ignored."""
        return dataclass_from_dict(cls, d, cls.LABEL)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def trajectory_settings(self) -> dict[str, Any]:
        """The settings that decide the weights a run reaches (its resume fingerprint)."""
        return {k: v for k, v in self.to_dict().items() if k not in self.NOT_FINGERPRINTED}


# YAML 1.1, which PyYAML (Snakemake's config reader) implements, takes a float only with a dot and, in
# an exponent, a sign: 5.0e-4 and 1.0e+5 are numbers, 5e-4 and 1.0e5 are strings (YAML 1.2 reads both).
_EXPONENT = re.compile(r"\s*([-+]?)(\d+)(\.\d*)?[eE]([-+]?)(\d+)\s*")


def yaml_number_hint(value: Any) -> str:
    """Why a config value that looks like a number is a string, and how to write it ('' otherwise)."""
    if not isinstance(value, str):
        return ""
    found = _EXPONENT.fullmatch(value)
    if found and not (found[3] and found[4]):  # with a dot and a signed exponent it was quoted
        sign, whole, fraction, exp_sign, exponent = found.groups()
        spelled = f"{sign}{whole}{fraction if fraction and len(fraction) > 1 else '.0'}e{exp_sign or '+'}{exponent}"
        return (f": YAML 1.1 (Snakemake's config reader) reads {value.strip()} as a string, not a number; "
                f"write {spelled}")
    if found or re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)\s*", value):
        return ": a string, not a number; write it without quotes"
    return ""


def is_real(value: Any) -> bool:
    """A plain or numpy real number; bool is not (YAML `yes` must not become sigma = 1)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


class FieldCheck:
    """Checks fields of one settings object in place; a passing value is normalised to its type
    (a YAML int where a float is meant, a numpy integer)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def error(self, name: str, why: str) -> ValueError:
        value = getattr(self.settings, name)
        return ValueError(f"{type(self.settings).__name__}.{name} {why}, got {value!r}{yaml_number_hint(value)}")

    def integer(self, name: str, low: int) -> None:
        value = getattr(self.settings, name)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise self.error(name, "must be an integer")
        if value < low:
            raise self.error(name, f"must be >= {low}")
        setattr(self.settings, name, int(value))

    def number(self, name: str, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
               high_open: bool = False) -> None:
        value = getattr(self.settings, name)
        ok = is_real(value) and math.isfinite(value) and (value > low if low_open else value >= low) \
            and (value < high if high_open else value <= high)
        if not ok:
            lo, hi = "(" if low_open else "[", ")" if high_open else "]"
            raise self.error(name, f"must be a finite number in {lo}{low}, {high}{hi}")
        setattr(self.settings, name, float(value))

    def choice(self, name: str, allowed: Sequence[Any]) -> None:
        if getattr(self.settings, name) not in allowed:
            raise self.error(name, f"must be one of {list(allowed)}")

    def boolean(self, name: str) -> None:
        if not isinstance(getattr(self.settings, name), bool):
            raise self.error(name, "must be true or false")
