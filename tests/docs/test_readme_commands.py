"""Every command README.md gives is run (scripts/check_readme.py) or skipped with its reason.

The fast tests: the extraction finds every kind of command, and each of the README's is
either a step of the check or in readme_commands.SKIPS. The slow one runs the check: the
set-up command, the calls, the scaling and multi-host commands against live stacks, and the
compose commands through the real Compose binary (the full compose run is
scripts/compose_smoke.sh, which needs Docker).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # NOTE: dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


rc = _module("readme_commands")

SAMPLE = """\
Start it: `.venv/bin/radixmesh up --workers 4
--gateways 2`, or `--port 9000` (a flag, not a command).

```bash
bash scripts/up.sh          # install, start
curl http://127.0.0.1:8000/generate -d '{
  "text": "x"}'
# {"text": ..., "meta_info": {"id": ...}}
.venv/bin/nats-server -n h1 -p 4222 \\
    --routes nats://h2:6222     # on h1
```

```python
from openai import OpenAI
```

```
client -> gateway   (a diagram, not code)
```
"""


def test_extraction_finds_every_kind_of_command():
    found = rc.extract(SAMPLE)
    assert [(c.kind, c.key) for c in found] == [
        ("inline", "radixmesh up --workers 4 --gateways 2"),
        ("bash", "bash scripts/up.sh"),
        ("bash", 'curl http://127.0.0.1:8000/generate -d {\n  "text": "x"}'),
        ("bash", "nats-server -n h1 -p 4222 --routes nats://h2:6222"),
        ("python", "from openai import OpenAI"),
    ]
    assert [c.line for c in found] == [1, 5, 6, 9, 14]
    assert found[2].expect == ['{"text": ..., "meta_info": {"id": ...}}']


def test_every_readme_command_is_run_or_skipped_with_a_reason():
    steps = rc.plan()
    unknown = [f"README.md:{c.line}: {c.text}" for c in steps.get("", [])]
    assert unknown == [], "add a step to scripts/check_readme.py or a reason to SKIPS:\n" + "\n".join(unknown)
    # the commands the issue names are run, not skipped
    for step in ("setup", "calls", "stack", "multi_host", "nats_cluster", "join_worker", "compose", "trace"):
        assert steps.get(step), f"README.md has no command for the {step!r} step"
    assert len(steps["calls"]) >= 3  # curl chat, the openai snippet, curl /generate
    assert {c.kind for c in steps["calls"]} == {"bash", "python"}


def test_an_unknown_command_fails_the_plan():
    steps = rc.plan("Try `radixmesh frobnicate --now` and `bash scripts/test.sh`.\n")
    assert [c.key for c in steps[""]] == ["radixmesh frobnicate --now"]
    assert [c.key for c in steps["skip:test-suite"]] == ["bash scripts/test.sh"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_readme_commands_run_as_written():
    if not (ROOT / ".venv" / "bin" / "radixmesh").exists():
        if os.environ.get("CI"):
            pytest.fail("CI without .venv: scripts/test.sh installs it")
        pytest.skip("needs the installed .venv (bash scripts/install.sh)")
    check = subprocess.Popen([sys.executable, "scripts/check_readme.py"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = check.communicate(timeout=1400)
    finally:
        if check.poll() is None:  # NOTE: Ctrl-C lets the check stop the stacks it started
            os.killpg(check.pid, signal.SIGINT)
            try:
                check.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(check.pid, signal.SIGKILL)
    assert check.returncode == 0, f"{stdout[-4000:]}\n{stderr[-4000:]}"
    assert "README commands ran" in stdout
