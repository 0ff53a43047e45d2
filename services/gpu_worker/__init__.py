"""The GPU worker: model weights, KV tensors, attention backend and sampling.

:class:`ModelRunner` executes one :class:`~libs.protocol.messages.ForwardBatch`
in-process; the service (``python -m services.gpu_worker``) puts it on the bus.
"""

from .model_runner import ModelRunner, RunnerConfig

__all__ = ["ModelRunner", "RunnerConfig"]
