"""docs/configuration.md is what scripts/gen_config_docs.py writes from the parsers today."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_matches_the_parsers():
    gen = _generator()
    expected = gen.render()
    current = gen.PAGE.read_text() if gen.PAGE.exists() else ""
    diff = "".join(list(difflib.unified_diff(current.splitlines(True), expected.splitlines(True),
                                             "docs/configuration.md", "the parsers"))[:60])
    assert current == expected, (
        "docs/configuration.md is out of date with the argparse parsers; run "
        f"`.venv/bin/python scripts/gen_config_docs.py`:\n{diff}")


def test_every_flag_of_radixmesh_up_is_on_the_page():
    gen = _generator()
    page = gen.PAGE.read_text()
    with gen._clean_environment():
        up = gen.up_parser()
    flags = [s for a in up._actions for s in a.option_strings if s.startswith("--") and a.dest != "help"]
    assert len(flags) > 60  # the launcher's own and every service's
    missing = [f for f in flags if f"`{f}`" not in page]
    assert not missing, f"not in docs/configuration.md: {missing}"
