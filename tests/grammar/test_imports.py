"""libs/grammar stays light: the scheduler and the gateway check patterns with it and never load torch."""

from __future__ import annotations

import subprocess
import sys


def test_grammar_imports_without_torch():
    code = ("import sys, libs.grammar, libs.grammar.json_schema, libs.grammar.regex_fsm; "
            "print(sorted(m for m in ('torch', 'transformers', 'libs.kernels') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
