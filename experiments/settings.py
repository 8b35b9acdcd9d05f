"""Experiment settings from the command line: ``--set NAME.FIELD=VALUE``.

Every experiment's ``Settings`` is a frozen dataclass of its defaults. ``bertscope run`` takes any number of
``--set heads.syntax_min_arcs=5 --set positions.window_len=16``; :func:`parse_assignments` splits them (no
import, so a malformed one costs nothing), :func:`apply_overrides` types each value by the field's annotation
and builds the experiment's settings (unknown experiment or field, a value of the wrong type, or one its
``Settings`` rejects: `UsageError`, one line), and :func:`describe_settings` lists every field with its type,
default and meaning (the field's comment in the source) for ``bertscope run NAME --help``.

Values: ``int``, ``float`` and ``str`` as written; ``bool`` as ``true/false`` (``yes/no``, ``1/0``); ``None`` as
``none``; a tuple as comma-separated items (``--set mixing.methods=attention,alti``; ``()`` or an empty value for an
empty tuple). A field typed ``bool | tuple[str, ...]`` takes either.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from bertscope.experiments.options import UsageError

#: ``--set`` spellings of booleans and of ``None``.
TRUE, FALSE, NONE = ("true", "yes", "on", "1"), ("false", "no", "off", "0"), ("none", "null")


def parse_assignments(items: Iterable[str] | None, experiments: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["heads.syntax_min_arcs=5", ...]`` -> ``{"heads": {"syntax_min_arcs": "5"}}`` (values still text).

    ``experiments``: the known experiment names (CLI spelling; ``same_token`` is read as ``same-token``). A
    malformed item, an unknown experiment or a field given twice is a `UsageError` naming the item.
    """
    out: dict[str, dict[str, str]] = {}
    for item in items or ():
        target, sep, value = item.partition("=")
        name, dot, field = target.strip().partition(".")
        if not sep or not dot or not name or not field:
            raise UsageError(f"--set {item}: expected NAME.FIELD=VALUE, e.g. --set heads.syntax_min_arcs=5")
        name = name.replace("_", "-")
        if name not in experiments:
            raise UsageError(f"--set {item}: unknown experiment {name!r}; choose one of {', '.join(experiments)}")
        field = field.strip()
        if field in out.setdefault(name, {}):
            raise UsageError(f"--set {item}: {name}.{field} is set twice")
        out[name][field] = value.strip()
    return out


def apply_overrides(name: str, defaults: Any, texts: dict[str, Any] | None) -> Any:
    """``defaults`` (an experiment's ``Settings`` instance) with the fields in ``texts`` (``{field: text}``)
    replaced by their typed values; ``defaults`` itself when ``texts`` is empty. Bad input: `UsageError`."""
    if not texts:
        return defaults
    if not dataclasses.is_dataclass(defaults):
        raise UsageError(f"--set {name}.*: this experiment's settings cannot be changed from the command line")
    fields = {f.name: f for f in dataclasses.fields(defaults)}
    hints = _type_hints(type(defaults))
    values = {}
    for field, text in texts.items():  # text: what the user typed (a typed value is taken as it is)
        if field not in fields:
            near = difflib.get_close_matches(field, list(fields), n=1)
            hint = f"did you mean {name}.{near[0]}? " if near else ""
            raise UsageError(f"--set {name}.{field}={text}: {name} has no setting {field!r}; {hint}"
                             f"`bertscope run {name} --help` lists them")  # fmt: skip
        if not isinstance(text, str):
            values[field] = text
            continue
        try:
            values[field] = coerce(text, hints.get(field, type(getattr(defaults, field))))
        except ValueError as e:
            raise UsageError(f"--set {name}.{field}={text}: {e}") from None
    try:
        return dataclasses.replace(defaults, **values)
    except (ValueError, TypeError) as e:
        shown = " ".join(f"{name}.{k}={t}" for k, t in texts.items())
        raise UsageError(f"--set {shown}: {' '.join(str(e).split())}") from None


def require(settings: Any, *, positive: Iterable[str] = (), non_negative: Iterable[str] = (),
            fraction: Iterable[str] = (), choices: dict[str, Iterable[Any]] | None = None,
            subsets: dict[str, Iterable[Any]] | None = None, non_empty: Iterable[str] = ()) -> None:
    """Range checks a ``Settings.__post_init__`` runs on its own fields (``ValueError`` naming the field, its value
    and what it takes; `apply_overrides` turns it into the one-line ``--set`` refusal). ``positive``: numbers
    (or every number of a tuple) ``>= 1`` for ints and ``> 0`` for floats, ``None`` allowed; ``non_negative``:
    ``>= 0``; ``fraction``: strictly between 0 and 1; ``choices``: field -> the values it takes; ``subsets``: a
    tuple field -> the items it may hold; ``non_empty``: tuple fields that need at least one item."""
    def numbers(name: str) -> list[Any]:
        value = getattr(settings, name)
        return [] if value is None else list(value) if isinstance(value, tuple) else [value]

    for name in positive:
        bad = [v for v in numbers(name) if isinstance(v, bool) or not (v >= 1 if isinstance(v, int) else v > 0)]
        if bad:
            raise ValueError(f"{name} must be {'>= 1' if isinstance(bad[0], int) else '> 0'}, got {bad[0]!r}")
    for name in non_negative:
        bad = [v for v in numbers(name) if v < 0]
        if bad:
            raise ValueError(f"{name} must be >= 0, got {bad[0]!r}")
    for name in fraction:
        bad = [v for v in numbers(name) if not 0 < v < 1]
        if bad:
            raise ValueError(f"{name} must be between 0 and 1 (exclusive), got {bad[0]!r}")
    for name, allowed in (choices or {}).items():
        allowed = tuple(allowed)
        if getattr(settings, name) not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}; got {getattr(settings, name)!r}")
    for name, allowed in (subsets or {}).items():
        allowed, value = tuple(allowed), tuple(getattr(settings, name))
        unknown = [v for v in value if v not in allowed]
        if unknown:
            raise ValueError(f"{name} takes items among {', '.join(map(str, allowed))}; got unknown "
                             f"{', '.join(map(repr, unknown))}")
    for name in non_empty:
        if not tuple(getattr(settings, name)):
            raise ValueError(f"{name} needs at least one item, got none")


def experiment_settings(module: Any, overrides: dict[str, dict[str, Any]] | None) -> Any:
    """The settings experiment ``module`` runs with: ``module.Settings()`` with its ``--set`` overrides
    (``overrides[module.NAME]``, see `apply_overrides`)."""
    return apply_overrides(module.NAME, module.Settings(), (overrides or {}).get(module.NAME))


def changed_fields(defaults: Any, settings: Any) -> dict[str, Any]:
    """The fields where ``settings`` differs from ``defaults`` (both the same dataclass), as ``{field: value}``."""
    if not dataclasses.is_dataclass(settings) or settings is defaults:
        return {}
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
            if getattr(settings, f.name) != getattr(defaults, f.name, object())}  # fmt: skip


def coerce(text: str, annotation: Any) -> Any:
    """``text`` as a value of type ``annotation`` (``int``, ``float``, ``str``, ``bool``, ``None``, ``tuple[T,
    ...]`` and unions of them); ``ValueError`` saying what was expected."""
    options = _union_members(annotation)
    lowered = text.strip().lower()
    for option in sorted(options, key=_rank):
        try:
            return _coerce_one(text, lowered, option)
        except ValueError:
            continue
    raise ValueError(f"expected {type_name(annotation)}, got {text!r}")


def type_name(annotation: Any) -> str:
    """A short name for a field's type as ``--set`` takes it: ``int``, ``int or none``, ``comma-separated str``."""
    names = []
    for option in _union_members(annotation):
        if option is type(None):
            names.append("none")
        elif typing.get_origin(option) is tuple:
            args = [a for a in typing.get_args(option) if a is not Ellipsis]
            names.append(f"comma-separated {type_name(args[0]) if args else 'str'}")
        else:
            names.append(getattr(option, "__name__", str(option)))
    return " or ".join(names)


@dataclasses.dataclass(frozen=True)
class SettingHelp:
    """One ``Settings`` field as ``run NAME --help`` lists it."""

    name: str
    type: str
    default: Any
    meaning: str


def describe_settings(settings_cls: type) -> list[SettingHelp]:
    """Every field of ``settings_cls`` with its type, default and meaning; the meaning is the field's comment in
    the source (the ``# ...`` after it, or the ``# ...`` lines right above it), ``""`` where it has none."""
    comments = field_comments(settings_cls)
    hints = _type_hints(settings_cls)
    defaults = settings_cls()
    return [SettingHelp(f.name, type_name(hints.get(f.name, f.type)), getattr(defaults, f.name),
                        comments.get(f.name, "")) for f in dataclasses.fields(settings_cls)]  # fmt: skip


def settings_help(name: str, settings_cls: type, width: int = 100) -> str:
    """The ``--set`` section of ``bertscope run NAME --help``: one entry per field (name, type, default,
    meaning)."""
    lines = [f"settings of {name} (change with --set {name}.FIELD=VALUE; recorded in the manifest):"]
    for s in describe_settings(settings_cls):
        default = ",".join(map(str, s.default)) if isinstance(s.default, tuple) else s.default
        lines.append(f"  {name}.{s.name}={default}  ({s.type})")
        if s.meaning:
            lines += textwrap.wrap(s.meaning, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def field_comments(settings_cls: type) -> dict[str, str]:
    """``{field: comment}`` read from the class's source: the trailing ``# ...`` on the field's line, after the
    ``# ...`` lines directly above it (joined into one sentence)."""
    try:
        source, first = inspect.getsourcelines(settings_cls)
    except (OSError, TypeError):
        return {}
    text = textwrap.dedent("".join(source))
    lines = text.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(text).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        i = node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            above.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        last = lines[node.end_lineno - 1]  # type: ignore[operator]
        trailing = _trailing_comment(last)
        out[node.target.id] = " ".join(p for p in [*above, trailing] if p)
    return out


# ----------------------------------------------------------------------------------------------------------


def _trailing_comment(line: str) -> str:
    """The ``# ...`` comment at the end of a source line (outside strings), without its ``#``."""
    import io
    import tokenize

    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if tok.type == tokenize.COMMENT:
                return tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return ""


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, vars(sys.modules.get(cls.__module__, types.ModuleType("x"))))
    except Exception:  # an annotation that does not resolve: fall back to the defaults' types
        return {}


def _rank(option: Any) -> int:
    # None first, bool before int (a bool is an int), int before float, tuples before str (str takes anything)
    scalars = [type(None), bool, int, float]
    return scalars.index(option) if option in scalars else 4 + (option is str)


def _union_members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def _coerce_one(text: str, lowered: str, option: Any) -> Any:
    if option is type(None):
        if lowered in NONE:
            return None
        raise ValueError
    if option is bool:
        if lowered in TRUE:
            return True
        if lowered in FALSE:
            return False
        raise ValueError
    if option in (int, float):
        return option(text.strip())
    if option is str:
        return text
    if typing.get_origin(option) is tuple:
        args = [a for a in typing.get_args(option) if a is not Ellipsis] or [str]
        body = text.strip().removeprefix("(").removesuffix(")")
        items = [t.strip() for t in body.split(",") if t.strip()]
        return tuple(coerce(t, args[0]) for t in items)
    if isinstance(option, type):
        return option(text)
    raise ValueError
