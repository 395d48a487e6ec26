"""The store's shape stays what the refactor made it: a small domain protocol, a thin facade,
no import circles, no project private used outside its module, no dialect rewriting.

``benchmarks/code_shape.py`` reads the tree statically; this row fails when a change grows the
facade or the protocol past its bound or reintroduces a circle, instead of a later benchmark
run noticing it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_store_protocol_and_the_facade_keep_their_shape() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "code_shape.py"), str(ROOT)],
                          capture_output=True, text=True, timeout=120, check=True)
    shape = json.loads(done.stdout)
    assert shape["store_protocol_members"] <= 12, shape["store_protocol_member_names"]
    assert shape["ledger_lines"] <= 250
    assert shape["import_cycles"] == 0, shape["import_cycle_modules"]
    assert shape["private_names_outside_module"] == 0, shape["private_names_top"]
    assert shape["placeholder_rewriting"] is False
