"""A reasoning-gym dataset and its difficulty settings, named by one string (the task spec `gym` tasks are built from).

    gym:chain_sum                                    the dataset with its own default settings
    gym:chain_sum?max_terms=2&max_digits=1           fields of its config dataclass (ChainSumConfig), FIELD=VALUE
    gym:basic_arithmetic?max_terms=2&operators=+,-   a list field: comma-separated items

The settings are the dataset's own config fields, checked against its config dataclass: the field must exist, the
value must read as the field's type (int, float, bool as true/false, str, a Literal's options, None as `none` for an
Optional, comma-separated items for a list or tuple of those), and the config's own `validate()` must pass. `seed`
and `size` are not settings: bebop draws the problems (`bebop.data.tasks.gym`). Each problem is one ValueError of a
single line naming the bad part, raised where `check_task_names` looks at the spec, before any job loads a model.

reasoning-gym is an optional dependency (`pip install 'bebop[gym]'`); without it, naming a gym task is that one line.
Importing it costs about a second (it registers its ~100 datasets), so it is imported when a gym spec is checked.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import typing
from dataclasses import dataclass
from typing import Any

PREFIX = "gym:"
INSTALL = "pip install 'bebop[gym]'"
RESERVED = ("seed", "size")  # bebop's: `GymTask.sample(n, seed)` draws the problems
_BOOLS = {"true": True, "false": False}


def is_gym_spec(spec: object) -> bool:
    """Whether `spec` names a reasoning-gym task (`gym:...`); what it names is checked by `parse_spec`."""
    return isinstance(spec, str) and spec.startswith(PREFIX)


def require_gym():
    """The `reasoning_gym.factory` registry, or the one line naming the install."""
    try:
        from reasoning_gym import factory
    except ImportError:
        raise ValueError(f"gym tasks need reasoning-gym, which is not installed: {INSTALL}") from None
    return factory


@dataclass(frozen=True)
class GymSpec:
    """A reasoning-gym dataset name and the config fields that set its difficulty, checked on construction."""

    dataset: str
    settings: tuple[tuple[str, Any], ...] = ()  # (field, value) pairs, in the order given

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or not isinstance(self.settings, tuple) or not all(
                isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) for pair in self.settings):
            raise ValueError(f"GymSpec needs a dataset name and a tuple of (field, value) pairs, got "
                             f"{self.dataset!r}, {self.settings!r}")
        config_cls = _config_class(self.dataset)
        names = [name for name, _ in self.settings]
        fields = settable_fields(config_cls)
        for name in names:
            if name in RESERVED:
                raise ValueError(f"task {self.text!r}: {name!r} is not a setting: bebop draws the problems "
                                 "(task.sample(n, seed))")
            if name not in fields:
                raise ValueError(f"task {self.text!r}: {self.dataset} has no setting {name!r}; its settings: "
                                 f"{', '.join(fields)}")
        if len(set(names)) != len(names):
            raise ValueError(f"task {self.text!r}: a setting is given twice")
        try:
            config = config_cls(**dict(self.settings))
            if hasattr(config, "validate"):
                config.validate()
        except Exception as err:  # the dataset's own checks are asserts, or a TypeError on a wrongly typed value
            why = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(f"task {self.text!r}: invalid settings: {why}") from None

    @property
    def text(self) -> str:
        """The spec string: gym:NAME, then ?FIELD=VALUE&... for the settings."""
        pairs = "&".join(f"{name}={_render(value)}" for name, value in self.settings)
        return PREFIX + self.dataset + (f"?{pairs}" if pairs else "")

    @property
    def config(self) -> dict[str, Any]:
        """The settings as keyword arguments of `reasoning_gym.create_dataset`."""
        return dict(self.settings)

    @classmethod
    def tiny(cls) -> "GymSpec":
        """The smallest problems of the best-known dataset: two one-digit terms of a chain sum."""
        return cls("chain_sum", (("max_terms", 2), ("max_digits", 1)))


def parse_spec(spec: str) -> GymSpec:
    """`gym:NAME?FIELD=VALUE&...` as a checked `GymSpec` (module docstring); a ValueError of one line otherwise."""
    if not is_gym_spec(spec):
        raise ValueError(f"task {spec!r} is not a gym spec: gym:NAME or gym:NAME?FIELD=VALUE&...")
    name, _, query = spec[len(PREFIX):].partition("?")
    if not name:
        raise ValueError(f"task {spec!r}: name a reasoning-gym dataset, e.g. gym:chain_sum?max_terms=2")
    config_cls = _config_class(name)
    types = settable_fields(config_cls)
    settings = []
    for pair in query.split("&") if query else []:
        field, sep, value = pair.partition("=")
        if not sep or not field:
            raise ValueError(f"task {spec!r}: {pair!r} is not FIELD=VALUE")
        if field not in types:  # reserved or unknown: GymSpec names the settings
            settings.append((field, value))
            continue
        settings.append((field, _parse(spec, field, value, types[field])))
    return GymSpec(name, tuple(settings))


def settable_fields(config_cls: type) -> dict[str, Any]:
    """The config fields a spec may set (all but seed and size) and their types."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(config_cls) if f.name not in RESERVED}


def _config_class(name: str) -> type:
    registry = require_gym().DATASETS
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry), n=3)
        hint = (f"; did you mean {', '.join(close)}?" if close
                else f" (its {len(registry)} datasets: reasoning_gym.factory.DATASETS)")
        raise ValueError(f"task {PREFIX + name!r}: reasoning-gym has no dataset {name!r}{hint}")
    return registry[name][1]


def _parse(spec: str, field: str, text: str, kind: Any) -> Any:
    """`text` read as a value of the field's type `kind` (module docstring), or a one-line ValueError."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Union and type(None) in args:  # Optional[X]
        inner = [a for a in args if a is not type(None)]
        return None if text.lower() == "none" else _parse(spec, field, text, inner[0] if len(inner) == 1 else Any)
    if origin in (list, tuple, collections.abc.Sequence):
        item = args[0] if args and args[0] is not Ellipsis else str
        if typing.get_origin(item) not in (None, typing.Literal):  # a list of tuples has no comma-separated form
            raise ValueError(f"task {spec!r}: {field} holds {kind}, which a spec cannot set")
        items = [_parse(spec, field, part, item) for part in text.split(",")] if text else []
        return tuple(items)  # a tuple for a list field too: the spec stays hashable, the dataset reads either
    if origin is typing.Literal:
        if text not in [str(a) for a in args]:
            raise ValueError(f"task {spec!r}: {field}={text!r} must be one of {', '.join(map(str, args))}")
        return next(a for a in args if str(a) == text)
    if kind is bool:
        if text.lower() not in _BOOLS:
            raise ValueError(f"task {spec!r}: {field}={text!r} must be true or false")
        return _BOOLS[text.lower()]
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            kind_name = "an int" if kind is int else "a float"
            raise ValueError(f"task {spec!r}: {field}={text!r} is not {kind_name}") from None
    if kind is str or kind is Any:
        return text
    raise ValueError(f"task {spec!r}: {field} holds {kind}, which a spec cannot set")


def _render(value: Any) -> str:
    """A setting's value as a spec writes it (the inverse of `_parse`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(_render(v) for v in value)
    return str(value)
