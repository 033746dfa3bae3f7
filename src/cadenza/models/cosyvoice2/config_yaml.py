"""Typed, strict access to the sections of a released ``cosyvoice2.yaml`` (``YamlSection``): every value is
checked as it is read, and every message names the file and the dotted key."""

from __future__ import annotations

import re
from typing import Any

from cadenza.errors import CheckpointError
from cadenza.models.cosyvoice2.config_checks import (
    int_what,
    is_int,
    is_real,
    real_what,
    show,
)
from cadenza.models.cosyvoice2.yaml_reader import Unresolved

REQUIRED: Any = object()
# YAML 1.2 floats such as ``1e-06`` (the release's sigma_min): HyperPyYAML (ruamel) reads them as numbers, PyYAML's
# YAML 1.1 resolver as strings.
YAML12_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


class YamlSection:
    """Typed access to one mapping of the yaml; every message names the file and the dotted key."""

    def __init__(self, data: dict[str, Any], source: str, path: str = "") -> None:
        self.data, self.source, self.path = data, source, path

    def key(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, msg: str) -> None:
        raise CheckpointError(f"{self.source}: {self.key(key)} {msg}")

    def _get(self, key: str, default: Any) -> tuple[bool, Any]:
        """(present, value); a missing required key and an unresolvable ``!ref`` fail here."""
        if key not in self.data:
            if default is REQUIRED:
                self.fail(key, "is required")
            return False, default
        value = self.data[key]
        if isinstance(value, Unresolved):
            self.fail(key, f"cannot be resolved: {value.reason}")
        return True, value

    def section(self, key: str, required: bool = True) -> YamlSection:
        present, value = self._get(key, REQUIRED if required else {})
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, got {show(value)}")
        return YamlSection(value, self.source, self.key(key))

    def check_tag(self, known: tuple[str, ...]) -> None:
        """The class a ``!new:``/``!name:`` tag names must be one of ``known`` (by its last dotted part)."""
        tag = self.data.get("__tag__")
        if tag is None:
            return
        if not isinstance(tag, str) or tag.rsplit(".", 1)[-1] not in known:
            raise CheckpointError(f"{self.source}: {self.path}: unknown class {show(tag)}; expected one of {known}")

    def _int_value(self, key: str, value: Any, minimum: int | None) -> int:
        if isinstance(value, float) and value.is_integer():  # !ref arithmetic with "/" gives floats
            value = int(value)
        if not is_int(value) or (minimum is not None and value < minimum):
            self.fail(key, f"must be {int_what(minimum)}, got {show(value)}")
        return value

    def integer(self, key: str, default: Any = REQUIRED, minimum: int | None = 1) -> Any:
        present, value = self._get(key, default)
        return self._int_value(key, value, minimum) if present else value

    def integers(self, key: str, default: Any = REQUIRED, length: int | None = None) -> tuple[int, ...]:
        present, value = self._get(key, default)
        if not present:
            return tuple(value)
        if not isinstance(value, (list, tuple)) or not value or (length is not None and len(value) != length):
            size = f"{length} positive integers" if length else "a non-empty list of positive integers"
            self.fail(key, f"must be {size}, got {show(value)}")
        return tuple(self._int_value(f"{key}[{i}]", v, 1) for i, v in enumerate(value))

    def nested_integers(self, key: str) -> tuple[tuple[int, ...], ...]:
        _, value = self._get(key, REQUIRED)
        if not isinstance(value, (list, tuple)) or not value:
            self.fail(key, f"must be a non-empty list of lists of positive integers, got {show(value)}")
        inner = YamlSection({f"{key}[{i}]": v for i, v in enumerate(value)}, self.source, self.path)
        return tuple(inner.integers(f"{key}[{i}]") for i in range(len(value)))

    def real(self, key: str, default: Any = REQUIRED, minimum: float | None = 0.0, positive: bool = False,
             maximum: float | None = None, allow_none: bool = False) -> Any:
        present, value = self._get(key, default)
        if not present or (allow_none and value is None):
            return value
        if isinstance(value, str) and YAML12_FLOAT.fullmatch(value.strip()):
            value = float(value)
        ok = is_real(value) and (minimum is None or value >= minimum) and (not positive or value > 0)
        if not ok or (maximum is not None and value > maximum):
            self.fail(key, f"must be {real_what(minimum, positive, maximum)}, got {show(value)}")
        return float(value)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        present, value = self._get(key, default)
        if present and (not isinstance(value, str) or value not in choices):
            self.fail(key, f"must be one of {choices}, got {show(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        present, value = self._get(key, default)
        if present and not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {show(value)}")
        return value
