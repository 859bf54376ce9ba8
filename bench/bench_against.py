"""Run a bench script against this checkout's gateway and another checkout's, alternately.

The other checkout (``REF``: e.g. ``git archive <commit> | tar -x -C /tmp/ref`` then ``make
.venv/.installed-test`` there) serves its own code from its own virtualenv; the bench script and
its load generator are this checkout's, so both gateways see the same requests. Rounds go
``ref, this, this, ref, ...`` so that a drift of the machine's load falls on both alike; each
run's table is printed under its label (read the best of each side per cell).

    .venv/bin/python bench/bench_against.py /tmp/ref bench/bench_kv_records.py --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tests.conftest as conftest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", type=Path, help="the other checkout (with its .venv)")
    parser.add_argument("script", type=Path)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2)")
    args, rest = parser.parse_known_args()
    own_bin, ref_bin = conftest.BIN, args.ref.resolve() / ".venv" / "bin"
    if not (ref_bin / "storage-gateway").exists():
        raise SystemExit(f"no gateway in {ref_bin}: run `make .venv/.installed-test` in {args.ref}")
    order = [side for pair in [("ref", "this") if n % 2 == 0 else ("this", "ref") for n in range(args.rounds)] for side in pair]
    for n, side in enumerate(order):
        conftest.BIN = ref_bin if side == "ref" else own_bin
        sys.argv = [str(args.script), *rest]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(args.script), run_name="__main__")
        print(f"\n===== run {n + 1}/{len(order)}: {side} ({conftest.BIN.parent.parent}) =====")
        print(out.getvalue(), flush=True)


if __name__ == "__main__":
    main()
