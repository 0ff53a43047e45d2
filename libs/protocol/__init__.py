"""Wire protocol of radixmesh: messages, subjects, codec and the bus wrapper."""

from .bus import Bus
from .errors import ServiceError
from .subjects import Subjects

__all__ = ["Bus", "ServiceError", "Subjects"]
