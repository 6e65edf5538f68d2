"""Grafana's PostgreSQL query expansion, for running a dashboard's SQL the way Grafana would.

Two steps, in Grafana's order:
1. Template variables (Grafana's frontend, `templateSrv.replace` with the PostgreSQL datasource's
   `interpolateVariable`): `$team`, `${team}`, `[[team]]`, with an optional `:raw`, `:csv` or
   `:sqlstring` format. A multi-value (or include-All) variable becomes `'a','b'` (each value quoted,
   quotes doubled); a single-value one is inserted as is, its quotes doubled. Unknown names are left
   alone, as Grafana does.
2. The backend (pkg/tsdb/sqleng `Interpolate`, then pkg/tsdb/grafana-postgresql-datasource
   `macros.go`): `$__interval`, `$__interval_ms`, `$__unixEpochFrom()`, `$__unixEpochTo()`, then the
   `$__name(args)` macros: `$__time`, `$__timeEpoch`, `$__timeFilter`, `$__timeFrom`, `$__timeTo`,
   `$__timeGroup`, `$__timeGroupAlias`, `$__unixEpochFilter`, `$__unixEpochNanoFilter`,
   `$__unixEpochNanoFrom`, `$__unixEpochNanoTo`, `$__unixEpochGroup`, `$__unixEpochGroupAlias`.
   For example `$__timeGroupAlias(ended_at, 1m)` becomes
   `floor(extract(epoch from ended_at)/60)*60 AS "time"`, and `$__timeFilter(ended_at)` becomes
   `ended_at BETWEEN '2024-05-01T10:00:00Z' AND '2024-05-01T16:00:00Z'`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal


class MacroError(ValueError):
    """A macro Grafana would refuse (unknown name, missing argument, bad interval)."""


# Grafana's template-variable syntax: $name, [[name]] / [[name:format]], ${name} / ${name:format}.
_VARIABLE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}"
)
# The backend's macro syntax (macros.go: `\$([_a-zA-Z0-9]+)\(([^\)]*)\)`).
_MACRO = re.compile(r"\$([_a-zA-Z0-9]+)\(([^)]*)\)")
_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class QueryContext:
    """What Grafana knows when it runs a panel's query."""

    time_from: datetime
    time_to: datetime
    interval: timedelta = timedelta(minutes=1)
    # name -> value: a str is a single-value variable, a sequence a multi-value (or All) one.
    variables: Mapping[str, str | Sequence[str]] = field(default_factory=dict)


def expand(sql: str, ctx: QueryContext) -> str:
    """The SQL Grafana would send to PostgreSQL for `sql` (a target's rawSql)."""
    return interpolate_macros(interpolate_variables(sql, ctx), ctx)


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _format_value(value: str | Sequence[str], fmt: str | None) -> str:
    values = [value] if isinstance(value, str) else list(value)
    multi = not isinstance(value, str)
    if fmt == "raw":
        return ",".join(values) if multi else values[0]
    if fmt == "csv":
        return ",".join(values)
    if fmt == "sqlstring":
        return ",".join(quote_literal(v) for v in values)
    if fmt is not None:
        raise MacroError(f"variable format {fmt!r} is not supported here")
    # The PostgreSQL datasource's interpolateVariable.
    if multi:
        return ",".join(quote_literal(v) for v in values)
    return values[0].replace("'", "''")


def interpolate_variables(sql: str, ctx: QueryContext) -> str:
    builtins: dict[str, str] = {
        "__from": str(_epoch_ms(ctx.time_from)),
        "__to": str(_epoch_ms(ctx.time_to)),
    }

    def replace(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name in ctx.variables:
            return _format_value(ctx.variables[name], fmt)
        if name in builtins:
            return builtins[name]
        return m.group(0)  # unknown (or a backend macro such as $__timeFilter): left alone

    return _VARIABLE.sub(replace, sql)


def interpolate_macros(sql: str, ctx: QueryContext) -> str:
    # sqleng.Interpolate: plain substitutions first.
    sql = sql.replace("$__interval_ms", str(int(ctx.interval.total_seconds() * 1000)))
    sql = sql.replace("$__interval", format_interval(ctx.interval))
    sql = sql.replace("$__unixEpochFrom()", str(int(_utc(ctx.time_from).timestamp())))
    sql = sql.replace("$__unixEpochTo()", str(int(_utc(ctx.time_to).timestamp())))
    original = sql

    def replace(m: re.Match[str]) -> str:
        name = m.group(1)
        # Pre-5.3 compatibility: `$__timeGroup(...)` followed directly by ',' gets an alias too
        # (Grafana looks at the first occurrence of the same text).
        if name == "__timeGroup":
            at = original.find(m.group(0))
            end = at + len(m.group(0))
            if at >= 0 and end < len(original) and original[end] == ",":
                name = "__timeGroupAlias"
        args = [a.strip(" ") for a in m.group(2).split(",")]
        return _evaluate(name, args, ctx)

    return _MACRO.sub(replace, sql)


def _evaluate(name: str, args: list[str], ctx: QueryContext) -> str:
    start, end = _utc(ctx.time_from), _utc(ctx.time_to)
    column = args[0] if args and args[0] != "" else None
    if name in ("__time", "__timeEpoch", "__timeFilter", "__unixEpochFilter", "__unixEpochNanoFilter"):
        if column is None:
            raise MacroError(f"missing time column argument for macro {name}")
    if name == "__time":
        return f'{column} AS "time"'
    if name == "__timeEpoch":
        return f'extract(epoch from {column}) as "time"'
    if name == "__timeFilter":
        return f"{column} BETWEEN '{rfc3339_nano(start)}' AND '{rfc3339_nano(end)}'"
    if name == "__timeFrom":
        return f"'{rfc3339_nano(start)}'"
    if name == "__timeTo":
        return f"'{rfc3339_nano(end)}'"
    if name in ("__timeGroup", "__unixEpochGroup"):
        if len(args) < 2:
            raise MacroError(f"macro {name} needs time column and interval and optional fill value")
        seconds = go_float(parse_interval(args[1].strip("'")).total_seconds())
        if name == "__timeGroup":
            return f"floor(extract(epoch from {args[0]})/{seconds})*{seconds}"
        return f"floor(({args[0]})/{seconds})*{seconds}"
    if name in ("__timeGroupAlias", "__unixEpochGroupAlias"):
        return _evaluate(name.removesuffix("Alias"), args, ctx) + ' AS "time"'
    if name == "__unixEpochFilter":
        return f"{column} >= {int(start.timestamp())} AND {column} <= {int(end.timestamp())}"
    if name == "__unixEpochNanoFilter":
        return f"{column} >= {_epoch_ns(start)} AND {column} <= {_epoch_ns(end)}"
    if name == "__unixEpochNanoFrom":
        return str(_epoch_ns(start))
    if name == "__unixEpochNanoTo":
        return str(_epoch_ns(end))
    raise MacroError(f"unknown macro {name!r}")


def parse_interval(text: str) -> timedelta:
    """gtime.ParseInterval for the fixed-length units (ms, s, m, h, d, w)."""
    m = _INTERVAL.match(text.strip())
    if not m:
        raise MacroError(f"error parsing interval {text}")
    return timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2)])


def format_interval(interval: timedelta) -> str:
    """gtime.FormatInterval: the largest whole unit, e.g. 60 s -> '1m', 90 s -> '1m'."""
    ms = int(interval.total_seconds() * 1000)
    for unit, size in (("y", 365 * 86_400_000), ("d", 86_400_000), ("h", 3_600_000),
                       ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            return f"{ms // size}{unit}"
    return "1ms"


def go_float(x: float) -> str:
    """Go's fmt %v of a float64 (strconv 'g', shortest): plain digits for exponents -4..5, else
    exponent form ('1e+06', '1.5e-05')."""
    if x == 0:
        return "0"
    _, digits, exp = Decimal(repr(abs(x))).normalize().as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits))
    exponent = len(text) + exp - 1
    head = "-" if x < 0 else ""
    if exponent < -4 or exponent >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{head}{mantissa}e{'+' if exponent >= 0 else '-'}{abs(exponent):02d}"
    return head + format(Decimal(repr(abs(x))).normalize(), "f")


def rfc3339_nano(t: datetime) -> str:
    """Go's time.RFC3339Nano of a UTC time: fraction without trailing zeros, 'Z'."""
    t = _utc(t)
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{t.microsecond:06d}".rstrip("0")
    return f"{text}.{frac}Z" if frac else f"{text}Z"


def _utc(t: datetime) -> datetime:
    if t.tzinfo is None:
        raise MacroError("times must be timezone-aware")
    return t.astimezone(UTC)


def _epoch_ms(t: datetime) -> int:
    return _epoch_ns(t) // 1_000_000


def _epoch_ns(t: datetime) -> int:
    delta = _utc(t) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
