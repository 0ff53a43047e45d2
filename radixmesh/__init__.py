"""radixmesh: a distributed LLM serving system over NATS."""

__version__ = "0.1.0"
