"""Cluster-scale simulation of routing: the real cache_index code, simulated workers.

``make_trace`` builds a synthetic trace, ``Simulation(trace, model, policy).run()``
serves it through services/cache_index's Router, ``summarize`` / ``markdown``
report it. ``radixmesh simulate`` (:mod:`.cli`) runs every policy on one trace.
"""

from .engine import RunResult, Simulation
from .model import ServiceModel
from .report import Summary, markdown, summarize
from .trace import Trace, TraceConfig, make_trace

__all__ = ["RunResult", "ServiceModel", "Simulation", "Summary", "Trace", "TraceConfig",
           "make_trace", "markdown", "summarize"]
