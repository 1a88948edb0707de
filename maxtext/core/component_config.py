"""A component's own settings: a frozen dataclass made from the run's config.

A run's config is one flat `ConfigDict` (`maxtext/configs/base.py`): it is
the file format and the `--config.X=Y` override syntax. A package that has
settings owns a frozen dataclass of just those (the mesh's `MeshConfig`, the
optimizer's `OptimizerConfig`, checkpointing's `CheckpointConfig`), subclass
of `ComponentConfig`: typed fields named as the config's fields, defaults
equal to base.py's, and a `validate` that raises one line naming the field
and the value. Its modules take that dataclass, never the whole config, so
what a package reads is what its dataclass declares.

`from_config` is the one builder of every such dataclass: each field is the
config's field of the same name, so no package keeps a copy of another's
field list. The caller's keyword arguments set a field the config does not
hold or one the caller decides (the mesh's `generation_devices`, which
only a GRPO run keeps); a field neither names takes its default. A field
typed with another package's settings class (the MLPerf log's `optimizer`,
an `OptimizerConfig`) is that class's own `from_config` of the same config,
so a package that works with another's settings holds them whole.
"""

import dataclasses
import typing
from typing import Any, Mapping, TypeVar

_Config = TypeVar("_Config", bound="ComponentConfig")


def fail(field: str, value: Any, why: str) -> ValueError:
  """The one-line error of a bad setting: `config.FIELD=VALUE: why`."""
  return ValueError(f"config.{field}={value!r}: {why}")


class ComponentConfig:
  """Base of a package's frozen settings dataclass (module docstring)."""

  def validate(self) -> None:
    """Raises ValueError (`fail`) on the first bad field; the subclass's
    checks of its own fields."""

  @classmethod
  def from_config(cls: type[_Config], config: Any, **given: Any) -> _Config:
    """The settings of `config`, checked.

    Args:
      config: the run's config (a ConfigDict, FrozenConfigDict or mapping of
        field names to values).
      **given: fields the caller sets, whatever the config holds.

    Returns:
      An instance of `cls`: each field from `given`, else (a field typed
      with a settings class) that class's `from_config(config)`, else the
      config's field of its name, else the dataclass default.

    Raises:
      TypeError: `cls` is no dataclass, or `given` names a field it lacks.
      ValueError: as `cls.validate`.
    """
    fields = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(given) - fields)
    if unknown:
      raise TypeError(f"{cls.__name__} has no field(s) {unknown}")
    values = _values(config, fields)
    nested = _nested(cls)
    taken = {
        name: nested[name].from_config(config)
        for name in fields
        if name not in given and name in nested
    }
    taken.update(
        (name, values[name])
        for name in fields
        if name not in given and name not in taken and name in values
    )
    settings = cls(**taken, **given)
    settings.validate()
    return settings


def _nested(cls: type) -> dict[str, type[ComponentConfig]]:
  """`cls`'s fields typed with a settings class, by name."""
  hints = typing.get_type_hints(cls)
  return {
      field.name: hints[field.name]
      for field in dataclasses.fields(cls)
      if isinstance(hints.get(field.name), type)
      and issubclass(hints[field.name], ComponentConfig)
  }


def _values(config: Any, names: set[str]) -> Mapping[str, Any]:
  """`config`'s fields of `names` that it holds, by name (field references
  resolved); only those are read, so building a settings object costs a
  few lookups whatever the config's size."""
  return {name: config[name] for name in names if name in config}


def defaults(cls: type[ComponentConfig]) -> dict[str, Any]:
  """The default of each field of `cls` that has one."""
  return {
      field.name: field.default
      for field in dataclasses.fields(cls)
      if field.default is not dataclasses.MISSING
  }
