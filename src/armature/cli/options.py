"""Flags from the configuration tree: each `Setting` field of a config dataclass becomes one
argparse option (its flag, its `ARMATURE_*` variable as the default, its help), and a parsed
namespace becomes the typed config again. Only the cli package reads a namespace.

    add_settings(parser, ServeConfig())   # --workers ... --max-num-seqs ... --port ...
    read_settings(namespace, ServeConfig) # -> ServeConfig(engine=EngineConfig(...), ...)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NoReturn, TypeVar, get_type_hints

from armature.config import Setting, env_name, flag_name, get_setting_value, iter_settings
from armature.errors import ConfigError

__all__ = [
    "CliError",
    "Parser",
    "add_settings",
    "arg_type",
    "is_given",
    "read_settings",
    "setup_logging",
    "with_dash_value_hint",
]

T = TypeVar("T")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class CliError(ConfigError):
    """A user mistake found by the CLI: printed as one line, exit code 2."""


def check_fits_index(flag: str, count: int, what: str = "workers", hint: str = "") -> None:
    """A one-line error when `count` workers (of `flag`) are more than the router's prefix
    index holds."""
    from armature.router.prefix_index import MAX_WORKERS

    if count > MAX_WORKERS:
        raise CliError(
            f"{flag}: the router's prefix index holds at most {MAX_WORKERS:,} {what}, "
            f"got {count:,}{hint}"
        )


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if level != "debug":  # one INFO line per HTTP request: an etcd lease's every keepalive
        logging.getLogger("httpx").setLevel(logging.WARNING)


# a namespace key: the dests of the options the command line gave (`is_given`)
GIVEN_KEY = "_given_dests"
_RECORDED_ACTIONS: tuple[str | None, ...] = (None, "store", "store_const", "store_true")
_RECORDED_ACTIONS += ("store_false", "append", "append_const", "count", "extend")


@functools.cache
def _recording(action: type[argparse.Action]) -> type[argparse.Action]:
    """`action` that also notes its dest in the namespace when the command line gives it."""

    class Recording(action):  # type: ignore[valid-type,misc]
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: Any,
            option_string: str | None = None,
        ) -> None:
            vars(namespace).setdefault(GIVEN_KEY, set()).add(self.dest)
            super().__call__(parser, namespace, values, option_string)

    Recording.__name__ = action.__name__
    return Recording


def is_given(args: argparse.Namespace, dest: str, default: object) -> bool:
    """Whether the option of `dest` was given: on the command line (even at its default
    value), or set otherwise than `default` (a namespace built by hand, an environment
    variable)."""
    return dest in vars(args).get(GIVEN_KEY, ()) or getattr(args, dest) != default


class Parser(argparse.ArgumentParser):
    """argparse's parser with one-line errors and options that note when they are given
    (`is_given`: a flag given at its default value where it does nothing is still a
    mistake)."""

    _arg_strings: Sequence[str] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in _RECORDED_ACTIONS:
            self.register("action", name, _recording(self._registry_get("action", name)))

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._arg_strings = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        message = with_dash_value_hint(message, self._arg_strings)
        options = [a for a in self._arg_strings if a.startswith("-")]
        if message.endswith("required: command") and options:  # `armature --bogus`
            message = f"unrecognized arguments: {' '.join(options)}; give a command first"
        self.exit(2, f"armature: error: {message} (see --help)\n")


_MISSING_VALUE = ": expected one argument"


def with_dash_value_hint(message: str, arg_strings: Sequence[str]) -> str:
    """argparse's `message`, saying how to pass the value it took for an option: one that
    starts with '-' and is not a plain number (`--prefill-input-tokens -64,256`) reads as a
    flag, so the flag before it seems to have no value."""
    if not (message.startswith("argument ") and message.endswith(_MISSING_VALUE)):
        return message
    flags = message[len("argument ") : -len(_MISSING_VALUE)].split("/")
    for i, text in enumerate(arg_strings[:-1]):
        value = arg_strings[i + 1]
        if text in flags and value[:1] == "-" and value[1:2].isdigit():
            return f"{message}: {value!r} reads as a flag; write {text}={value}"
    return message


def _dest(path: tuple[str, ...]) -> str:
    return "__".join(path)


def arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _from_env(
    field: dataclasses.Field[Any],
    setting: Setting,
    text: str,
    choices: Sequence[str] | None = None,
) -> Any:
    """The value a setting's environment variable holds, one of `choices` when given (else
    of the setting's own); ConfigError naming it if invalid."""
    name = env_name(field.name, setting)
    try:
        if isinstance(field.default, bool):  # a switch, as add_settings decides
            lowered = text.strip().lower()
            if lowered not in _TRUE + _FALSE:
                raise ConfigError(f"expected one of {', '.join(_TRUE + _FALSE[:-1])}")
            present = lowered in _TRUE
            return (not present) if setting.negate else present
        parse = setting.parse or str
        if setting.repeat:
            return _comma_list(text, parse, secret=setting.secret)
        value = parse(text)
        allowed = setting.choices if choices is None else choices
        if allowed is not None and value not in allowed:
            raise ConfigError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return value
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _comma_list(text: str, parse: Callable[[str], Any], *, secret: bool) -> list[Any]:
    """A repeatable setting's variable: a comma list, each item parsed. Blank: no items (the
    chart sets ARMATURE_API_KEYS empty where it has no keys). An empty item is an error: with
    API keys, `"$KEY1,$KEY2"` with both unset would turn the protection off unseen."""
    if not text.strip():
        return []
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        shown = "" if secret else f": {text!r}"  # a secret's other items are not shown
        raise ConfigError(f"an item of the comma list is empty{shown}")
    return [parse(part) for part in parts]


# a namespace key holding a bad variable's error (`check_env_errors`)
ENV_ERROR_PREFIX = "_env_error_"


def check_env_errors(namespace: argparse.Namespace) -> None:
    """ConfigError for the first bad `ARMATURE_*` variable the parsed command takes (a bad
    variable of another command's setting does not stop this one)."""
    for key, value in sorted(vars(namespace).items()):
        if key.startswith(ENV_ERROR_PREFIX):
            raise ConfigError(value)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, as one would type them (a list as a comma list); none for a
    switch (its help says whether it is on) or an option without one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            return action.help
        if action.default is None:
            return action.help
        if isinstance(action.default, list | tuple) and action.help is not None:
            shown = ",".join(str(v) for v in action.default) or "none"
            return f"{action.help} (default: {shown.replace('%', '%%')})"  # help is %-formatted
        return super()._get_help_string(action)


def add_settings(
    parser: argparse._ActionsContainer,
    defaults: Any,
    *,
    choices: Mapping[str, Sequence[str]] | None = None,
    environ: Mapping[str, str] | None = None,
    only: Collection[str] | None = None,
) -> None:
    """One option per setting of the config `defaults` (an instance: its values are the
    defaults; a variable `ARMATURE_*` set in `environ` replaces them). `choices` maps a dotted
    field path to its allowed values when they come from elsewhere (the engine registry).
    `only`: just these dotted field paths (a command that takes a few of a section's)."""
    environ = os.environ if environ is None else environ
    for path, field, setting in iter_settings(type(defaults)):
        if only is not None and ".".join(path) not in only:
            continue
        default = get_setting_value(defaults, path)
        variable = env_name(field.name, setting)
        allowed = (choices or {}).get(".".join(path), setting.choices)
        if variable in environ:
            try:
                default = _from_env(field, setting, environ[variable], allowed)
            except ConfigError as exc:  # an error of the commands that take it only
                parser.set_defaults(**{ENV_ERROR_PREFIX + variable: str(exc)})
        # argparse expands %-formats in help ("70% of" would break --help)
        help_text = f"{setting.help} (env {variable})".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": _dest(path), "help": help_text}
        flag = flag_name(field.name, setting)
        if isinstance(field.default, bool):
            kwargs.update(action="store_false" if setting.negate else "store_true")
            kwargs["default"] = default
            # a switch: whether giving it changes anything, not its field's value
            in_effect = default is (not setting.negate)
            kwargs["help"] = f"{help_text} (default: {'on' if in_effect else 'off'})"
        elif setting.repeat:
            kwargs.update(action="append", default=list(default))
            if setting.parse is not None:
                kwargs["type"] = arg_type(setting.parse)
        else:
            kwargs["default"] = default
            if setting.parse is not None:
                kwargs["type"] = arg_type(setting.parse)
            if allowed is not None:
                kwargs["choices"] = list(allowed)
        if not isinstance(field.default, bool) and allowed is None:
            kwargs["metavar"] = flag.replace("-", "_").upper()  # not the nested dest's name
        parser.add_argument(f"--{flag}", **kwargs)


def read_settings(namespace: argparse.Namespace, config_type: type[T]) -> T:
    """The config of type `config_type` that the parsed `namespace` holds."""
    config: T = _build(namespace, config_type, ())
    return config


def _build(namespace: argparse.Namespace, config_type: type[Any], path: tuple[str, ...]) -> Any:
    hints = get_type_hints(config_type)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config_type):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            values[f.name] = _build(namespace, kind, (*path, f.name))
        elif "setting" in f.metadata:
            value = getattr(namespace, _dest((*path, f.name)))
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return config_type(**values)
