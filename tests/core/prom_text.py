"""A strict reader of the Prometheus text exposition format (0.0.4) for tests.

It raises ``ValueError`` on anything a Prometheus server would reject or that our output must
never contain: a sample before its family's HELP and TYPE, a family declared twice or split,
an unknown type, a bad metric or label name, a bad escape, a duplicate label or series, a
value that is not a number, a negative counter, a timestamp, an empty line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
TYPES = {"counter", "gauge"}


@dataclass
class Family:
    name: str
    help: str
    type: str = ""
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def value(self, **labels: str) -> float:
        """The value of the one sample with exactly these labels."""
        found = [v for lab, v in self.samples if lab == labels]
        if len(found) != 1:
            raise KeyError(labels)
        return found[0]


def _unescape(text: str, quote: bool) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1: i + 2]
            allowed = {"\\": "\\", "n": "\n", **({'"': '"'} if quote else {})}
            if nxt not in allowed:
                raise ValueError(f"bad escape in {text!r}")
            out.append(allowed[nxt])
            i += 2
            continue
        if ch == "\n" or (quote and ch == '"'):
            raise ValueError(f"unescaped character in {text!r}")
        out.append(ch)
        i += 1
    return "".join(out)


def _labels(text: str) -> tuple[dict[str, str], str]:
    """Parse ``{a="b",...}`` at the start of ``text``; return the labels and the rest."""
    labels: dict[str, str] = {}
    i = 1
    while True:
        if text[i] == "}":
            return labels, text[i + 1:]
        eq = text.index("=", i)
        name = text[i:eq]
        if not LABEL.match(name) or name.startswith("__") or name in labels:
            raise ValueError(f"bad or repeated label name {name!r}")
        if text[eq + 1] != '"':
            raise ValueError("label value must be quoted")
        j = eq + 2
        while text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        labels[name] = _unescape(text[eq + 2: j], quote=True)
        i = j + 1
        if text[i] == ",":
            i += 1
            if text[i] == "}":
                raise ValueError("trailing comma")
        elif text[i] != "}":
            raise ValueError("labels must be separated by commas")


def parse(text: str) -> dict[str, Family]:
    """Parse an exposition strictly; return its families by name."""
    if not text.endswith("\n"):
        raise ValueError("an exposition ends with a line feed")
    families: dict[str, Family] = {}
    current: Family | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for line in text[:-1].split("\n"):
        if not line:
            raise ValueError("empty line")
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            if not NAME.match(name) or name in families:
                raise ValueError(f"bad or repeated family {name!r}")
            current = families[name] = Family(name, _unescape(help_text, quote=False))
            if not current.help:
                raise ValueError("empty help")
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            if current is None or name != current.name or current.type or current.samples:
                raise ValueError(f"TYPE of {name!r} out of place")
            if kind not in TYPES:
                raise ValueError(f"unknown type {kind!r}")
            current.type = kind
        elif line.startswith("#"):
            raise ValueError("unexpected comment")
        else:
            if current is None or not current.type:
                raise ValueError("sample before its HELP and TYPE")
            cut = min(i for i in (line.find("{"), line.find(" ")) if i >= 0)
            name, rest = line[:cut], line[cut:]
            if name != current.name:
                raise ValueError(f"sample {name!r} outside its family")
            labels: dict[str, str] = {}
            if rest.startswith("{"):
                labels, rest = _labels(rest)
            if not rest.startswith(" ") or " " in rest[1:]:
                raise ValueError("one value, no timestamp")
            value = float(rest[1:])
            if math.isnan(value) or (current.type == "counter" and value < 0):
                raise ValueError("bad value")
            key = (name, tuple(sorted(labels.items())))
            if key in seen:
                raise ValueError(f"duplicate series {key!r}")
            seen.add(key)
            current.samples.append((labels, value))
    for family in families.values():
        if not family.type:
            raise ValueError(f"{family.name} has no TYPE")
        if family.type == "counter" and not family.name.endswith("_total"):
            raise ValueError("a counter's name ends in _total")
    return families
