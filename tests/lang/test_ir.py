import pytest

from radixmesh.lang import assistant, gen, select, user
from radixmesh.lang.ir import Expr, Gen, Role, as_parts


def test_parts_concatenate_in_order():
    e = "Q: " + gen("a", max_tokens=4) + "\n" + select("b", ["x", "y"])
    assert isinstance(e, Expr)
    assert [type(p).__name__ for p in e.parts] == ["str", "Gen", "str", "Select"]
    assert as_parts("t") == ("t",)
    r = user("hi " + gen("g"))
    assert isinstance(r, Role) and r.role == "user" and r.body.parts[0] == "hi "
    assert assistant(gen("x")).body.parts == (Gen("x"),)


@pytest.mark.parametrize("make", [
    lambda: gen("a", max_tokens=0),
    lambda: select("a", []),
    lambda: select("a", ["ok", ""]),
    lambda: gen("a", regex=""),
    lambda: gen("a", regex="x+", json_schema={"type": "string"}),
])
def test_invalid_parts(make):
    with pytest.raises(ValueError):
        make()


def test_unknown_part_type():
    with pytest.raises(TypeError):
        gen("a") + 3
