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
    ("worker idle", "worker_idle", "{:.1%}"),
)


def _cell(value, fmt: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt.format(value)


def markdown_table(summaries: list[Summary]) -> str:
    lines = ["| " + " | ".join(c[0] for c in _COLUMNS) + " |",
             "|" + "---|" * len(_COLUMNS)]
    for s in summaries:
        cells = [f"{s.completed}/{s.failed}" if attr is None else _cell(getattr(s, attr), fmt)
                 for _, attr, fmt in _COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _clean(value):
    """JSON without NaN (strict parsers reject it): NaN -> null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, meta: dict, summaries: list[Summary], records: list[Record]) -> None:
    body = {"meta": meta, "summaries": [dataclasses.asdict(s) for s in summaries],
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
