"""``radixmesh bench``: the benchmark harness every performance claim uses.

Workloads (:mod:`.workloads`) are generated from a seed; :mod:`.runner` drives
them against a gateway with Poisson arrivals or a concurrency limit and records
every request (:mod:`.record`); :mod:`.hf` is the in-process HF baseline;
:mod:`.stats` and :mod:`.report` summarize. Entry point: :mod:`.cli`.
"""
