import pytest

from radixmesh.bench.tokens import ChatTokenizer
from radixmesh.models import resolve_model


@pytest.fixture(scope="session")
def chat_tok() -> ChatTokenizer:
    return ChatTokenizer.load(resolve_model("default"))
