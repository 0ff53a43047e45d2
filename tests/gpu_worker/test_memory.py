"""The memory a worker may still take: MemAvailable, capped by a container's cgroup limit."""

from __future__ import annotations

from services.gpu_worker.memory import available_bytes

MEMINFO = "MemTotal:       65536000 kB\nMemFree:         1000 kB\nMemAvailable:   32768000 kB\n"


def _files(tmp_path, meminfo: str | None = MEMINFO, **cgroup: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    if meminfo is not None:
        (tmp_path / "meminfo").write_text(meminfo)
    root = tmp_path / "cgroup"
    for name, text in cgroup.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "meminfo"), str(root)


def test_without_a_cgroup_limit_the_kernels_figure(tmp_path):
    meminfo, root = _files(tmp_path, **{"memory.max": "max\n", "memory.current": "123\n"})
    assert available_bytes(meminfo, root) == 32768000 * 1024
    meminfo, root = _files(tmp_path / "none")  # no cgroup files at all
    assert available_bytes(meminfo, root) == 32768000 * 1024


def test_a_containers_limit_caps_what_the_host_reports(tmp_path):
    two_gib = 2 << 30
    meminfo, root = _files(tmp_path, **{"memory.max": f"{two_gib}\n", "memory.current": f"{1 << 30}\n"})
    assert available_bytes(meminfo, root) == 1 << 30  # the host says 31 GiB: the container has 1 left
    meminfo, root = _files(tmp_path / "v1", **{"memory__memory.limit_in_bytes": f"{two_gib}\n",
                                               "memory__memory.usage_in_bytes": f"{two_gib + 5}\n"})
    assert available_bytes(meminfo, root) == 0  # over the limit already: nothing


def test_cgroup_v1s_unlimited_number_is_no_limit_and_nothing_known_is_none(tmp_path):
    meminfo, root = _files(tmp_path, **{"memory__memory.limit_in_bytes": str((1 << 63) - 4096),
                                        "memory__memory.usage_in_bytes": "4096"})
    assert available_bytes(meminfo, root) == 32768000 * 1024
    meminfo, root = _files(tmp_path / "empty", meminfo=None)
    assert available_bytes(meminfo, root) is None
