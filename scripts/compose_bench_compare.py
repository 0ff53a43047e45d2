"""Prints the compose stack's `radixmesh bench` rows beside the local stack's, and fails
where compose is more than --tolerance slower (used by scripts/compose_smoke.sh).

    python scripts/compose_bench_compare.py --local a.json c.json --compose b.json d.json

Each file is a results.json of `radixmesh bench`; each side's best round counts (the machine
is shared: the best round is the one least disturbed by others), every round is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLUMNS = (("out tok/s", "output_throughput", "{:.1f}"), ("TTFT p50 ms", "ttft_p50_ms", "{:,.0f}"),
           ("TPOT p50 ms", "tpot_p50_ms", "{:.1f}"), ("requests", "completed", "{}"))


def summary(path: Path) -> dict:
    body = json.loads(path.read_text())
    (row,) = body["summaries"]  # one system: the gateway at --url
    if row.get("failed"):
        raise SystemExit(f"FAIL: {path}: {row['failed']} requests failed")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local", nargs="+", type=Path, required=True)
    p.add_argument("--compose", nargs="+", type=Path, required=True)
    p.add_argument("--tolerance", type=float, default=0.10, help="how much slower compose may be")
    args = p.parse_args(argv)
    rows = [(f"{side} {i + 1}", summary(path)) for side, paths in (("local", args.local), ("compose", args.compose))
            for i, path in enumerate(paths)]
    print("| run | " + " | ".join(c[0] for c in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name, row in rows:
        cells = [fmt.format(row[key]) if row.get(key) is not None else "-" for _, key, fmt in COLUMNS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    local = max(r["output_throughput"] for n, r in rows if n.startswith("local"))
    compose = max(r["output_throughput"] for n, r in rows if n.startswith("compose"))
    ratio = compose / local
    print(f"best out tok/s: compose {compose:.1f}, local {local:.1f}: compose/local {ratio:.3f}"
          f" (at least {1 - args.tolerance:.2f} wanted)")
    if ratio < 1 - args.tolerance:
        print(f"FAIL: compose is {100 * (1 - ratio):.0f}% slower than the local stack", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
