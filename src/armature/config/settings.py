"""How a configuration field is also a command-line setting (`Setting`, `setting`), and what
is derived from that one definition: the flag, the `ARMATURE_*` variable, and `to_argv`, the
command line that rebuilds a configuration."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from armature.errors import ConfigError

__all__ = [
    "Setting",
    "env_name",
    "flag_name",
    "get_setting_value",
    "iter_settings",
    "setting",
    "setting_env_names",
    "to_argv",
]


@dataclass(frozen=True)
class Setting:
    """A field's one definition as a command-line setting.

    The flag is `--<field name with dashes>` unless `flag` names it; the environment variable
    is `ARMATURE_<flag name in capitals>` unless `env` names it. `parse` turns the flag's text
    into the value (str when None); `choices` limits it. A bool field is a switch: present sets
    it to True, or to False with `negate`. `repeat`: the flag may be given several times
    (a tuple of values; its variable holds a comma list). `secret`: never on a command line
    (`to_argv` leaves it out; pass it in the environment)."""

    help: str
    flag: str | None = None
    env: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    negate: bool = False
    repeat: bool = False
    secret: bool = False


def setting(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field that is also a command-line setting (see `Setting`)."""
    return field(default=default, metadata={"setting": Setting(help, **kwargs)})


def flag_name(field_name: str, setting: Setting) -> str:
    """The flag without its dashes: `max_num_seqs` -> `max-num-seqs`."""
    return setting.flag or field_name.replace("_", "-")


def env_name(field_name: str, setting: Setting) -> str:
    """The environment variable: `max_num_seqs` -> `ARMATURE_MAX_NUM_SEQS`."""
    return setting.env or "ARMATURE_" + flag_name(field_name, setting).replace("-", "_").upper()


def iter_settings(
    config_type: type[Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dataclasses.Field[Any], Setting]]:
    """Every setting of `config_type` and its sections, depth first: (field path, field,
    setting). A field whose type is a config dataclass is a section, not a setting."""
    hints = get_type_hints(config_type)
    for f in dataclasses.fields(config_type):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from iter_settings(kind, (*path, f.name))
        elif "setting" in f.metadata:
            yield (*path, f.name), f, f.metadata["setting"]


def get_setting_value(config: Any, path: tuple[str, ...]) -> Any:
    """The value at a field path (`("engine", "max_num_seqs")`) of a config."""
    for name in path:
        config = getattr(config, name)
    return config


def setting_env_names(config_type: type[Any]) -> set[str]:
    """The environment variables every setting of `config_type` reads."""
    return {env_name(f.name, s) for _, f, s in iter_settings(config_type)}


def to_argv(config: Any) -> list[str]:
    """The flags that rebuild `config` from its type's defaults: every setting whose value
    differs, secrets left out (pass them in the environment). Parsing the result with the
    command's flags gives back `config` (a test checks every field)."""
    defaults = type(config)()
    argv: list[str] = []
    for path, f, setting in iter_settings(type(config)):
        value = get_setting_value(config, path)
        if value == get_setting_value(defaults, path) or setting.secret:
            continue
        flag = f"--{flag_name(f.name, setting)}"
        if isinstance(f.default, bool):
            if value is not setting.negate:  # the flag sets what a non-default needs
                argv.append(flag)
                continue
            raise ConfigError(f"{flag} cannot be turned off on a command line")
        if value is None:
            raise ConfigError(f"{flag} cannot be reset to its default on a command line")
        if setting.repeat:
            for item in value:
                argv += [flag, str(item)]
        elif isinstance(value, tuple):
            argv += [flag, ",".join(str(item) for item in value)]
        else:
            argv += [flag, str(value)]
    return argv
