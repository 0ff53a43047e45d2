"""Free lists for KV slots and worker table rows (bookkeeping only, no tensors)."""

from __future__ import annotations

import numpy as np


class OutOfSlots(RuntimeError):
    pass


class SlotAllocator:
    """A stack of free KV slot indices; allocation and free are bulk numpy ops."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = np.arange(num_slots - 1, -1, -1, dtype=np.int64)
        self._top = num_slots  # _free[:_top] are free

    @property
    def num_free(self) -> int:
        return self._top

    def alloc(self, n: int) -> np.ndarray:
        if n > self._top:
            raise OutOfSlots(f"need {n} slots, {self._top} free")
        self._top -= n
        # NOTE: copy, so later frees that overwrite the stack cannot alias it.
        return self._free[self._top : self._top + n][::-1].copy()

    def free(self, slots: np.ndarray) -> None:
        n = len(slots)
        if self._top + n > self.num_slots:
            raise RuntimeError("double free of KV slots")
        self._free[self._top : self._top + n] = slots[::-1]
        self._top += n


class RowAllocator:
    """Rows of the worker's request -> slots table."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self._free = list(range(num_rows - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise OutOfSlots("no free request rows")
        return self._free.pop()

    def free(self, row: int) -> None:
        self._free.append(row)
