"""Groups (DESIGN §8): an ordering key given at publish, carried by Message and
MessageInfo; on both twins."""

from __future__ import annotations

import pytest

import novaque

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]


def test_a_group_travels_with_its_message(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    one = client.publish("t", b"a", group="order-42")
    many = client.publish_many("t", [b"b", b"c", b"d"], groups=["x", None, "x "])
    plain = client.publish("t", b"e")
    deduplicated = client.publish("t", b"f", dedup_key="k", group="order-7")
    got = client.claim("t", "c", max_messages=10)
    assert [(m.body, m.group) for m in got] == [
        (b"a", "order-42"),
        (b"b", "x"),
        (b"c", None),
        (b"d", "x "),  # kept exactly, trailing space too
        (b"e", None),
        (b"f", "order-7"),
    ]
    assert client.get_message(one).group == "order-42"
    assert client.get_message(plain).group is None
    assert client.get_message(deduplicated).group == "order-7"
    assert [info.group for info in client.list_messages("t")] == [
        "order-42",
        "x",
        None,
        "x ",
        None,
        "order-7",
    ]
    assert many == sorted(many)


@pytest.mark.parametrize(
    ("group", "error"),
    [
        (42, TypeError),
        (b"bytes", TypeError),
        ("", novaque.InvalidOption),
        ("g" * 201, novaque.InvalidOption),
        ("nul\x00", novaque.InvalidOption),
    ],
)
def test_bad_groups_are_refused_before_anything_is_written(
    client: novaque.Client, group: object, error: type[Exception]
) -> None:
    client.ensure_channel("t", "c")
    with pytest.raises(error, match="group"):
        client.publish("t", b"x", group=group)  # type: ignore[arg-type]
    with pytest.raises(error, match="group"):
        client.publish_many("t", [b"x", b"y"], groups=["ok", group])  # type: ignore[list-item]
    assert client.list_messages("t") == []


def test_groups_needs_one_entry_per_body(client: novaque.Client) -> None:
    with pytest.raises(novaque.InvalidOption, match="groups has 1 entries for 2 bodies"):
        client.publish_many("t", [b"x", b"y"], groups=["a"])
    with pytest.raises(TypeError, match="groups must be a sequence"):
        client.publish_many("t", [b"x"], groups="a")
    assert client.publish("t", b"z", group="g" * 200) > 0
