"""``--sweep "tp=1,2,4 pp=1,2"``: configurations of one script, by placeholder substitution.

Each name of the sweep is a placeholder ``{name}`` in the script's arguments (or in the
values of ``--env NAME=VALUE``); every combination of the values is one configuration. A
name no argument uses is an error (a typo would otherwise plan the same job many times).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

__all__ = ["parse_sweep", "Substitution", "substitutions"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_sweep(text: str | None) -> dict[str, list[str]]:
    """``"tp=1,2 ac=none,full"`` -> ``{"tp": ["1", "2"], "ac": ["none", "full"]}``."""
    if not text:
        return {}
    sweep: dict[str, list[str]] = {}
    for part in text.split():
        name, sep, values = part.partition("=")
        if not sep or not _NAME.match(name) or not values:
            raise ValueError(f"--sweep: {part!r} is not NAME=V1,V2,...; write e.g. --sweep \"tp=1,2,4 pp=1,2\"")
        if name in sweep:
            raise ValueError(f"--sweep: {name!r} is given twice")
        listed = [v for v in values.split(",")]
        if any(not v for v in listed):
            raise ValueError(f"--sweep: {part!r} has an empty value")
        sweep[name] = listed
    return sweep


@dataclass(frozen=True)
class Substitution:
    """One configuration's values, arguments and extra environment."""

    values: tuple[tuple[str, str], ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values) or "(as given)"


def _fill(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text


def substitutions(sweep: dict[str, list[str]], args: list[str],
                  env: dict[str, str]) -> list[Substitution]:
    """Every combination of the sweep's values, substituted into ``args`` and ``env``."""
    used = " ".join(args) + " " + " ".join(env.values())
    unused = [name for name in sweep if "{" + name + "}" not in used]
    if unused:
        raise ValueError(f"--sweep names {', '.join(unused)} but no script argument or --env value "
                         f"contains {', '.join('{' + n + '}' for n in unused)}; put the placeholder "
                         "where the value goes, e.g. -- train.py --tp {tp}")
    names = list(sweep)
    out = []
    for combo in itertools.product(*(sweep[n] for n in names)) if names else [()]:
        values = dict(zip(names, combo))
        out.append(Substitution(values=tuple(values.items()), args=tuple(_fill(a, values) for a in args),
                                env=tuple((k, _fill(v, values)) for k, v in env.items())))
    return out
