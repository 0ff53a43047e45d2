"""``radixmesh bench`` against a peer: the session's radixmesh stack, addressed as any
OpenAI-compatible server (``openai=<its gateway URL>``)."""

import argparse
import json
import shutil

import pytest

from radixmesh.bench import peer, session
from radixmesh.bench.cli import add_arguments
from radixmesh.bench.errors import BenchError

pytestmark = pytest.mark.integration


def _args(tmp_path, systems: str, *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--quick", "--workload", "random", "--param", "requests=1",
                         "--param", "max_prompt_tokens=150", "--param", "max_tokens=2", "--max-concurrency", "1", "--warmup", "0",
                         "--api", "chat", "--threads", "1", "--systems", systems, "--no-plots",
                         "--no-progress", "--output-dir", str(tmp_path), *extra])


def _run(tmp_path, systems: str, *extra: str) -> tuple[dict, str]:
    out = tmp_path / f"run{len(list(tmp_path.iterdir())) if tmp_path.exists() else 0}"
    assert session.run_session(_args(out, systems, *extra)) == 0
    [run_dir] = out.iterdir()
    return json.loads((run_dir / "results.json").read_text()), (run_dir / "table.md").read_text()


def _row(table: str, system: str) -> list[str]:
    head = next(line for line in table.splitlines() if line.startswith("| system |"))
    row = next(line for line in table.splitlines() if line.startswith(f"| {system} |"))
    return {k.strip(): v.strip() for k, v in zip(head.strip("|").split("|"), row.strip("|").split("|"))}


def test_a_peer_starts_cold_where_it_can_empty_its_cache_else_warm(stack, tmp_path, monkeypatch):
    cold, table = _run(tmp_path, f"mesh:openai={stack.url}")
    row = _row(table, "mesh")
    assert row["ok/failed"] == "1/0" and row["cache at start"] == "cold"
    assert row["of it from host"] == row["of it from store"] == row["worker idle"] == "-"
    assert row["cache hit"].endswith("%")  # the gateway reports cached_tokens
    assert "ceilings (measured in this run, 1 threads" in table and "GFLOP/s" in table
    meta = cold["meta"]
    assert meta["peers"]["mesh"] == {"url": stack.url, "model": meta["peers"]["mesh"]["model"],
                                     "start": "cold", "reset": "/flush_cache"}
    assert meta["ceilings"]["matmul_gflops"] > 0 and meta["ceilings"]["copy_gbs"] > 0
    first = cold["records"][0]
    assert first["cached_tokens"] == 0 and first["prompt_tokens"] > 100  # emptied before it

    # a server offering only vLLM's reset, which the gateway does not have: it runs warm
    monkeypatch.setattr(peer, "RESETS", ("/reset_prefix_cache",))
    warm, table = _run(tmp_path, f"mesh:openai={stack.url}")
    assert _row(table, "mesh")["cache at start"] == "warm"
    assert any("no cache reset (/reset_prefix_cache: HTTP 404), so it ran warm" in n
               for n in warm["meta"]["notes"])
    again = warm["records"][0]  # the same prompt as the cold run's: cached from it
    assert again["prompt_tokens"] == first["prompt_tokens"]
    assert again["cached_tokens"] >= first["prompt_tokens"] // 2


def test_a_peer_serving_another_model_is_refused_at_the_start(stack, model_dir, tmp_path):
    with pytest.raises(BenchError, match=r"serves \['.+'\], not --peer-model 'gpt-oss'"):
        session.run_session(_args(tmp_path / "a", f"openai={stack.url}", "--peer-model", "gpt-oss"))
    # the workload's tokenizer renders prompts another way than the served model's
    other = tmp_path / "other-model"
    shutil.copytree(model_dir, other, ignore=shutil.ignore_patterns("*.safetensors"))
    (other / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    (other / "chat_template.jinja").write_text(
        "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}### assistant:{% endif %}")
    with pytest.raises(BenchError, match="serves another model than the workload was built for"):
        session.run_session(_args(tmp_path / "b", f"openai={stack.url}", "--model", str(other)))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
