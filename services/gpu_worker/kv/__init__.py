"""KV bytes in and out of the pool: a step's copies (copy.py), the shared store's I/O
(store_io.py, store_service.py) and prefill/decode transfer between workers (send.py,
recv.py, wired by service.py; transfer.py: config, reasons, metrics)."""
