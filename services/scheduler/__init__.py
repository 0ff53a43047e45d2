"""Per-worker scheduling: KV slot bookkeeping, queues, continuous batching."""
