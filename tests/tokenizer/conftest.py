"""The default model's real tokenizer, loaded once for the tokenizer tests."""

from __future__ import annotations

import pytest

from libs.models import resolve_model
from services.tokenizer.encoder import Encoder


@pytest.fixture(scope="session")
def model_dir():
    return resolve_model("default")


@pytest.fixture(scope="session")
def encoder(model_dir) -> Encoder:
    return Encoder.load(model_dir)


@pytest.fixture(scope="session")
def tokenizer(encoder):
    return encoder.tokenizer
