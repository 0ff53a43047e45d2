"""Outputs of a run: the markdown table, the JSON file with every record, PNG plots."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from .record import Record
from .stats import Summary

_COLUMNS = (
    ("system", "system", "{}"),
    ("ok/failed", None, ""),
    ("req/s", "request_throughput", "{:.2f}"),
    ("out tok/s", "output_throughput", "{:.1f}"),
    ("TTFT p50 (ms)", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p90 (ms)", "ttft_p90_ms", "{:.0f}"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "{:.0f}"),
    ("TPOT p50 (ms)", "tpot_p50_ms", "{:.1f}"),
    ("TPOT p90 (ms)", "tpot_p90_ms", "{:.1f}"),
    ("cache hit", "cache_hit_rate", "{:.1%}"),
    ("of it from host", "host_hit_rate", "{:.1%}"),
    ("of it from store", "store_hit_rate", "{:.1%}"),
    ("worker idle", "worker_idle", "{:.1%}"),
    ("cache at start", "start", "{}"),
)


def _cell(value, fmt: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt.format(value)


# per request class (kind): the streams' decode cadence apart from the documents' TTFT
_CLASS_COLUMNS = (
    ("system", "system", "{}"),
    ("class", "class", "{}"),
    ("ok/failed", None, ""),
    ("out tok/s", "output_throughput", "{:.1f}"),
    ("TTFT p50 (ms)", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "{:.0f}"),
    ("TPOT p50 (ms)", "tpot_p50_ms", "{:.1f}"),
    ("TPOT p99 (ms)", "tpot_p99_ms", "{:.1f}"),
    ("ITL p99 (ms)", "itl_p99_ms", "{:.0f}"),
)


def _table(columns, rows: list[dict]) -> str:
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"{row['completed']}/{row['failed']}" if attr is None else _cell(row[attr], fmt)
                 for _, attr, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_table(summaries: list[Summary]) -> str:
    return _table(_COLUMNS, [dataclasses.asdict(s) for s in summaries])


def class_table(classes: list[tuple[str, Summary]]) -> str:
    """One row per (system, request class), from :func:`stats.summarize_by_kind`."""
    return _table(_CLASS_COLUMNS, [dict(dataclasses.asdict(s), **{"class": kind})
                                   for kind, s in classes])


PD_GOALS = {"tpot_p99": 0.5, "throughput": 0.9}  # the disaggregation issue's


def pd_goals(summaries: list[Summary], classes: list[tuple[str, Summary]], base: str, pd: str,
             kind: str) -> list[str]:
    """``pd`` against ``base``: the ``kind`` requests' TPOT p99 (goal <= 0.5x) and the
    total output throughput (goal >= 0.9x); empty unless both ran."""
    total = {s.system: s for s in summaries}
    of_kind = {s.system: s for k, s in classes if k == kind}
    if not {base, pd} <= set(total) or not {base, pd} <= set(of_kind):
        return []
    if not (of_kind[base].tpot_p99_ms > 0 and total[base].output_throughput > 0):
        return []  # NOTE: also NaN (nothing measured)
    tpot = of_kind[pd].tpot_p99_ms / of_kind[base].tpot_p99_ms
    tput = total[pd].output_throughput / total[base].output_throughput
    verdict = lambda ok: "met" if ok else "not met"  # noqa: E731
    return [f"{pd} / {base}: {kind} TPOT p99 {tpot:.2f}x (goal <= {PD_GOALS['tpot_p99']}x: "
            f"{verdict(tpot <= PD_GOALS['tpot_p99'])}), output throughput {tput:.2f}x "
            f"(goal >= {PD_GOALS['throughput']}x: {verdict(tput >= PD_GOALS['throughput'])})"]


TIER_GOALS = {"hit_of_ideal": 0.9, "ttft_p50": 0.15}  # the memory-tiers issue's


def tier_goals(summaries: list[Summary], base: str, tiered: list[str], ideal: float) -> list[str]:
    """Each of ``tiered`` against ``base`` (tiers off): the total cache hit rate against
    the workload's ``ideal`` (goal >= 0.9x) and TTFT p50 (goal <= 0.15x); empty unless
    ``base`` and one of them ran."""
    total = {s.system: s for s in summaries}
    if base not in total or not ideal > 0 or not total[base].ttft_p50_ms > 0:
        return []
    verdict = lambda ok: "met" if ok else "not met"  # noqa: E731
    lines = []
    for name in (n for n in tiered if n in total):
        s = total[name]
        hit, ttft = s.cache_hit_rate / ideal, s.ttft_p50_ms / total[base].ttft_p50_ms
        lines.append(
            f"{name} / {base}: cache hit {s.cache_hit_rate:.1%} = {hit:.2f}x the workload's ideal "
            f"{ideal:.1%} (goal >= {TIER_GOALS['hit_of_ideal']}x: {verdict(hit >= TIER_GOALS['hit_of_ideal'])}), "
            f"TTFT p50 {ttft:.2f}x (goal <= {TIER_GOALS['ttft_p50']}x: {verdict(ttft <= TIER_GOALS['ttft_p50'])})")
    return lines


def _clean(value):
    """JSON without NaN (strict parsers reject it): NaN -> null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, meta: dict, summaries: list[Summary], records: list[Record],
               classes: list[tuple[str, Summary]] = ()) -> None:
    body = {"meta": meta, "summaries": [dataclasses.asdict(s) for s in summaries],
            "class_summaries": [dict(dataclasses.asdict(s), **{"class": kind})
                                for kind, s in classes],
            "records": [dataclasses.asdict(r) for r in records]}
    path.write_text(json.dumps(_clean(body), indent=1, allow_nan=False) + "\n")


def plot(out_dir: Path, summaries: list[Summary], records: list[Record], title: str) -> list[Path]:
    """ttft.png (TTFT distribution per system) and throughput.png; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [s.system for s in summaries]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in names:
        ttft = [r.ttft_s * 1000 for r in records
                if r.system == name and r.ok and r.ttft_s is not None]
        if ttft:
            ax.ecdf(ttft, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT distribution: {title}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    ttft_path = out_dir / "ttft.png"
    fig.savefig(ttft_path, dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, attr, label in ((axes[0], "output_throughput", "output tokens/s"),
                            (axes[1], "request_throughput", "requests/s")):
        values = [getattr(s, attr) for s in summaries]
        bars = ax.bar(names, values, color=[f"C{i}" for i in range(len(names))])
        ax.bar_label(bars, fmt="%.2f" if attr == "request_throughput" else "%.1f")
        ax.set_ylabel(label)
        ax.margins(y=0.15)
        ax.tick_params(axis="x", labelrotation=15)
    fig.suptitle(f"Throughput: {title}")
    fig.tight_layout()
    tput_path = out_dir / "throughput.png"
    fig.savefig(tput_path, dpi=120)
    plt.close(fig)
    return [ttft_path, tput_path]
