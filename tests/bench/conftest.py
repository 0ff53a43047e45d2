import pytest

from libs.models import resolve_model
from radixmesh.bench.tokens import ChatTokenizer


@pytest.fixture(scope="session")
def chat_tok() -> ChatTokenizer:
    return ChatTokenizer.load(resolve_model("default"))
