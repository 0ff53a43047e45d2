"""The memory this process may still take: the kernel's MemAvailable, capped by the cgroup's
limit where a container has one (a container's /proc/meminfo shows the host's memory)."""

from __future__ import annotations

from pathlib import Path

# (limit, usage) files: cgroup v2, then v1; a v2 limit of "max" (or v1's huge number) is none
_CGROUP_FILES = (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"))


def available_bytes(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Bytes free to take, or None where neither source says."""
    found = [n for n in (_meminfo_available(Path(meminfo)), _cgroup_headroom(Path(cgroup))) if n is not None]
    return min(found) if found else None


def _meminfo_available(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom(root: Path) -> int | None:
    for limit_name, usage_name in _CGROUP_FILES:
        try:
            limit, usage = (root / limit_name).read_text().strip(), (root / usage_name).read_text().strip()
        except OSError:
            continue
        if not limit.isdigit() or not usage.isdigit() or int(limit) >= 1 << 60:
            return None  # no limit
        return max(0, int(limit) - int(usage))
    return None
