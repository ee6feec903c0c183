"""Channel filters (DESIGN §8): CEL expressions over headers, group and topic,
checked at ensure_channel, evaluated at publish, failing closed; on both twins."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

import novaque
from novaque import _filters, _validate, schema
from tests.conftest import Backend, FakeClock

pytestmark = pytest.mark.usefixtures("twin")

GOLD = 'headers["tier"] == "gold"'
#: Three nested ``all`` macros over 230-element lists (1.4 KB): 12 million
#: evaluations of the innermost expression, which once hung every publish.
ZEROS = "[" + ",".join("0" * 230) + "]"
NESTED_ALL = f"{ZEROS}.all(a, {ZEROS}.all(b, {ZEROS}.all(c, a == b)))"
TWENTY = "[" + ",".join("0" * 20) + "]"
#: Accepted filters whose cost is close to the limit: nested macros over
#: lists, and a string built from the longest values headers can hold.
TEN, THIRTY_FOUR = "[" + ",".join("0" * 10) + "]", "[" + ",".join("0" * 34) + "]"
COSTLIEST = {
    "nested": f"{TEN}.all(a, {THIRTY_FOUR}.exists(b, a == b && headers.size() >= 120))",
    "concat": " + ".join(f'headers["h00{i}"]' for i in range(5))
    + ' != "" && headers.size() >= 120',
}


def bodies(client: novaque.Client, topic: str, channel: str) -> list[bytes]:
    got = client.claim(topic, channel, max_messages=100)
    client.ack_many(got)
    return [m.body for m in got]


@pytest.mark.parametrize(
    ("expression", "match"),
    [
        ("headers[", "does not parse"),
        ("tier == 'gold'", "uses tier"),
        ("group", "not boolean"),
        ('headers["tier"]', "not boolean"),
        ('topic + "x"', "not boolean"),
        ("size(topic)", "not boolean"),
        # Known types: a call's result type is known, and it is not bool.
        ('int(headers["n"])', "not boolean"),
        ('headers["n"].size()', "not boolean"),
        ('string(headers["n"])', "not boolean"),
        ('true ? int(headers["n"]) : true', "have types int and bool"),
        ('headers["n"] == 1', "compares string with int"),
        # Deeper than the evaluator can run.
        ("(" * 1500 + "true" + ")" * 1500, "nests too deep"),
        ("!" * 600 + "true", "nests too deep"),
        # Too costly to run at every publish.
        (NESTED_ALL, "evaluation steps; the limit is 20,000"),
        ("headers.all(a, headers.exists(b, b == a))", "the limit is 20,000"),
        # Text no database stores.
        ('headers["k"] == "\udcff"', "lone surrogate"),
        ('headers["k"] == "a\x00b"', "NUL"),
        ("headers.tier == 'gold' // \udcff", "lone surrogate"),
    ],
)
def test_a_bad_filter_raises_invalid_filter_and_stores_nothing(
    client: novaque.Client, expression: str, match: str
) -> None:
    client.ensure_channel("t", "c", filter=GOLD)
    with pytest.raises(novaque.InvalidFilter, match=match) as raised:
        client.ensure_channel("t", "c", filter=expression)
    assert isinstance(raised.value, novaque.NovaqueError)
    assert client.channel_settings("t", "c").filter == GOLD
    with pytest.raises(novaque.InvalidFilter):
        client.ensure_channel("t", "new", filter=expression)
    assert client.list_channels("t") == ["c"]
    with pytest.raises(TypeError, match="filter must be a str"):
        client.ensure_channel("t", "c", filter=1)  # type: ignore[arg-type]


def test_a_filter_takes_only_the_messages_it_is_true_for(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "eu", filter='topic == "t" && headers["region"].startsWith("eu-")')
    client.ensure_channel("t", "all")
    client.publish("t", b"g", headers={"tier": "gold", "region": "us-1"})
    client.publish_many("t", [b"s1", b"s2"], headers={"tier": "silver", "region": "eu-2"})
    client.publish("t", b"g-eu", headers={"tier": "gold", "region": "eu-1"})
    assert bodies(client, "t", "gold") == [b"g", b"g-eu"]
    assert bodies(client, "t", "eu") == [b"s1", b"s2", b"g-eu"]
    assert bodies(client, "t", "all") == [b"g", b"s1", b"s2", b"g-eu"]
    client.flush_stats()
    # A channel whose filter is false counts nothing.
    assert client.channel_counters("t", "gold").published == 2
    assert client.channel_counters("t", "all").published == 4


def test_group_is_the_empty_string_for_a_message_without_one(client: novaque.Client) -> None:
    client.ensure_channel("t", "ungrouped", filter='group == ""')
    client.ensure_channel("t", "grouped", filter='group != ""')
    client.publish("t", b"x")
    assert bodies(client, "t", "ungrouped") == [b"x"]
    assert bodies(client, "t", "grouped") == []


def test_an_evaluation_error_fails_closed_with_a_warning(
    client: novaque.Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "all")
    assert GOLD in failed_closed(client, caplog, "gold")  # headers["tier"]: no such key


def failed_closed(
    client: novaque.Client, caplog: pytest.LogCaptureFixture, channel: str, **headers: str
) -> str:
    """The one WARNING about a filter of a publish to topic ``t`` that
    ``channel`` did not take (failing closed) and channel ``all`` did."""
    with caplog.at_level(logging.WARNING, logger="novaque"):
        client.publish("t", b"x", headers=headers or None)
    assert bodies(client, "t", channel) == []
    assert bodies(client, "t", "all") == [b"x"]
    [record] = [r for r in caplog.records if "filter" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "topic t" in record.getMessage()
    return record.getMessage()


def test_a_stored_filter_too_costly_to_run_fails_closed_at_once(
    backend: Backend, client: novaque.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A filter stored before novaque bounded their cost (written here straight
    into the table) is not run: every publish counts it false, with a WARNING."""
    costly = f"{TWENTY}.all(a, {TWENTY}.all(b, {TWENTY}.all(c, a == b)))"
    with pytest.raises(novaque.InvalidFilter, match="evaluation steps"):
        client.ensure_channel("t", "costly", filter=costly)
    client.ensure_channel("t", "costly")
    client.ensure_channel("t", "all")
    with backend.engine().begin() as conn:
        conn.execute(
            sa.update(schema.channels)
            .where(schema.channels.c.name == "costly")
            .values(filter_expr=costly)
        )
    assert "the limit is 20,000" in failed_closed(client, caplog, "costly")


def test_an_evaluation_over_its_step_budget_stops_and_fails_closed(
    client: novaque.Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget of one evaluation is a second line behind the static bound:
    an evaluation that reaches it stops there, counts as false, and says so."""
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "all")
    monkeypatch.setattr(_filters, "MAX_STEPS", 5)
    warning = failed_closed(client, caplog, "gold", tier="gold")
    assert "stopped after 5 evaluation steps" in warning


def test_a_publish_with_the_most_headers_through_the_costliest_filters_stays_in_budget(
    client: novaque.Client,
) -> None:
    """The filters closest to the limit, over a message of as many headers as
    a message may carry (the publisher's choice): each evaluation takes at
    most its static cost, which is within the budget, and the publish
    delivers."""
    headers = {f"h{i:03}": "v" * 100 for i in range(_validate.MAX_HEADERS)}
    for name, expression in COSTLIEST.items():
        client.ensure_channel("t", name, filter=expression)
        assert 0.7 * _filters.MAX_COST < _filters.cost(expression) <= _filters.MAX_COST
        verdict, steps = _filters.evaluate(expression, headers, None, "t")
        assert verdict is True
        assert steps <= _filters.cost(expression) <= _filters.MAX_STEPS
    client.publish("t", b"x", headers=headers)
    for name in COSTLIEST:
        assert bodies(client, "t", name) == [b"x"]


def test_a_message_every_filter_refuses_is_stored_without_the_no_channel_warning(
    client: novaque.Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.ensure_channel("quiet", "gold", filter=GOLD)
    with caplog.at_level(logging.WARNING, logger="novaque"):
        message_id = client.publish("quiet", b"x", headers={"tier": "tin"})
    assert client.get_message(message_id).deliveries == []
    assert not [r for r in caplog.records if "has no channel" in r.getMessage()]


def test_removing_a_filter_with_the_empty_string_or_reset(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", filter=GOLD)
    client.ensure_channel("t", "c", filter="")
    assert client.channel_settings("t", "c").filter is None
    client.publish("t", b"1")
    client.ensure_channel("t", "c", filter=GOLD)
    client.publish("t", b"2")
    client.ensure_channel("t", "c", reset=("filter",))
    client.publish("t", b"3")
    assert bodies(client, "t", "c") == [b"1", b"3"]


def test_filters_hold_for_dedup_keys_and_a_callers_transaction(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "all")
    client.publish("t", b"k", dedup_key="k", headers={"tier": "gold"})
    client.publish("t", b"k", dedup_key="k", headers={"tier": "gold"})  # no second copy
    client.publish("t", b"j", dedup_key="j", headers={"tier": "iron"})
    assert bodies(client, "t", "gold") == [b"k"]
    assert bodies(client, "t", "all") == [b"k", b"j"]
    if backend.twin == "sync":  # the twin's caller transactions are tested in test_aio
        with backend.engine().begin() as conn:
            client.publish("t", b"in-tx", headers={"tier": "gold"}, connection=conn)
        assert bodies(client, "t", "gold") == [b"in-tx"]


def test_a_filter_set_by_another_client_holds_for_the_next_publish(
    backend: Backend, clock: FakeClock
) -> None:
    publisher = backend.client(clock=clock)
    operator = backend.client(clock=clock)
    publisher.ensure_channel("t", "c")
    publisher.publish("t", b"before")  # the publisher knows the topic: one statement
    operator.ensure_channel("t", "c", filter=GOLD)
    publisher.publish("t", b"iron", headers={"tier": "iron"})
    publisher.publish_many("t", [b"gold"], headers={"tier": "gold"})
    operator.ensure_channel("t", "c", filter="")
    publisher.publish("t", b"after")
    assert bodies(operator, "t", "c") == [b"before", b"gold", b"after"]


def test_replay_honours_filters_unless_channels_are_named(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "all")
    iron = client.publish("t", b"iron", headers={"tier": "iron"})
    gold = client.publish("t", b"gold", headers={"tier": "gold"})
    bodies(client, "t", "gold")
    bodies(client, "t", "all")
    assert client.replay(iron) == 1  # to "all" only
    assert client.replay(gold) == 2
    assert bodies(client, "t", "gold") == [b"gold"]
    assert bodies(client, "t", "all") == [b"iron", b"gold"]
    assert client.replay(iron, channels=["gold"]) == 1  # named: the filter is bypassed
    assert bodies(client, "t", "gold") == [b"iron"]
    since = clock() - __import__("datetime").timedelta(minutes=1)
    assert client.replay_range("t", since, clock() + __import__("datetime").timedelta(1)) == 3


@contextmanager
def statements(backend: Backend) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(*args: object) -> None:
        seen.append(str(args[2]))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", count)


#: Statements of a publish of one message, and of three, to a topic of plain
#: channels, as novaque sent them before filters existed (measured at
#: 72e7bf7): PostgreSQL one; SQLite the message and the fan-out (for three:
#: the messages, last_insert_rowid, the channels, the fan-out); MariaDB the
#: messages, the fan-out and SET TRANSACTION.
PUBLISH_STATEMENTS = {"postgres": (1, 1), "sqlite": (2, 4), "mysql": (3, 3)}


def test_publishing_to_a_topic_without_filters_costs_no_extra_statement(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("plain", "a")
    client.ensure_channel("plain", "b")
    client.ensure_channel("other", "gold", filter=GOLD)  # another topic's filter
    client.publish("plain", b"warm-up")  # learns the topic id
    with statements(backend) as seen:
        client.publish("plain", b"x")
    assert len(seen) == PUBLISH_STATEMENTS[backend.name][0], seen
    with statements(backend) as seen:
        client.publish_many("plain", [b"1", b"2", b"3"])
    assert len(seen) == PUBLISH_STATEMENTS[backend.name][1], seen


# The language, without a database: what the static check accepts runs in
# cel-python, within the cost the check computed.

#: A message's headers for the evaluations below.
HEADERS = {"n": "5", "at": "2024-01-01T00:00:00Z", "tier": "gold", "path": "/api/v2/x"}
#: Accepted filters, each true for HEADERS, group "g1" and topic "t": one use
#: of every operator, function and macro the check knows.
ACCEPTED = [
    GOLD,
    'headers.exists(k, k == "tier") && headers.all(k, k.size() <= 8)',
    "headers.tier == 'gold'",
    'has(headers.tier) && !has(headers.missing) && "n" in headers',
    'group == "g1" && topic.startsWith("t") && topic.endsWith("t") && group.contains("1")',
    'headers.path.matches("^/api/v[0-9]+/") && matches(headers.path, "x$")',
    "int(headers.n) + 1 == 6 && int(headers.n) * 2 == 10 && int(headers.n) / 2 == 2",
    "int(headers.n) % 2 == 1 && -int(headers.n) < 0 && int(headers.n) - 1 >= 4",
    "uint(headers.n) == 5u && 1u + 2u == 3u && 5u % 3u == 2u && 2u > 1u",
    "double(headers.n) == 5.0 && 2.0 * 3.0 == 6.0 && 1.5 <= 2.5 && -(1.0) < 0.0",
    'string(int(headers.n)) == "5" && string(5u) == "5" && string(1.5) == "1.5"',
    'string(b"ab") == "ab" && bytes("ab") == b"ab" && b"a" + b"b" == b"ab" && b"a" < b"b"',
    'bool("true") && bool(true) && false < true && "a" < "b" && size("abc") == 3',
    'headers.size() == 4 && size(headers) == 4 && "abc".size() == 3 && size(b"ab") == 2',
    'size([1, 2]) == 2 && [1, 2].size() == 2 && {"a": 1}.size() == 1',
    "[1] + [2] == [1, 2] && 1 in [1, 2] && [[1]][0][0] == 1 && [] == [] && size([]) == 0",
    '{"a": 1}["a"] == 1 && "a" in {"a": 1} && {"a": "b"}.a == "b" && {} == {}',
    'timestamp(headers.at) < timestamp("2025-01-01T00:00:00Z")',
    'timestamp(headers.at) + duration("1h") > timestamp(headers.at)',
    'duration("1h") + timestamp(headers.at) > timestamp(headers.at)',
    'timestamp(headers.at) - duration("1h") < timestamp(headers.at)',
    'timestamp("2025-01-01T00:00:00Z") - timestamp(headers.at) > duration("1h")',
    'duration("1h") + duration("1m") > duration("1h") && -duration("1h") < duration("0s")',
    "int(timestamp(headers.at)) > 0 && string(timestamp(headers.at)) == headers.at",
    "timestamp(headers.at).getFullYear() == 2024 && timestamp(headers.at).getMonth() == 0",
    'timestamp(headers.at).getFullYear("Europe/Paris") == 2024',
    "timestamp(headers.at).getDate() == 1 && timestamp(headers.at).getDayOfWeek() == 1",
    "timestamp(headers.at).getDayOfMonth() == 0 && timestamp(headers.at).getDayOfYear() == 0",
    'timestamp(headers.at).getHours("+01:00") == 1 && timestamp(headers.at).getMinutes() == 0',
    "timestamp(headers.at).getSeconds() == 0 && timestamp(headers.at).getMilliseconds() == 0",
    'duration("90m").getHours() == 1 && duration("1h").getMinutes() == 60',
    'duration("1s").getSeconds() == 1 && duration("1500ms").getMilliseconds() == 1500',
    "[1, 2].map(x, x * 2) == [2, 4] && [1, 2].filter(x, x > 1) == [2]",
    '[1, 2].exists_one(x, x > 1) && {"a": 1}.all(k, k == "a") && [1].exists(x, x == 1)',
    '[[1, 2], [3]].all(l, l.all(x, x > 0)) && ["eu", "us"].exists(r, headers.tier != r)',
    "true ? headers.tier == 'gold' : false",
    '(headers.tier + "/" + group) == "gold/g1" && null == null && 1 != 2',
    '"""gold""" == headers.tier && r"\\d" == "\\\\d" && 0x10 == 16 && 1e3 == 1000.0',
    "9223372036854775807 > -9223372036854775808 && 18446744073709551615u > 0u",
    'headers.n > "4"  // a comment',
    f"{TWENTY}.all(a, {TWENTY}.exists(b, a == b))",
    *COSTLIEST.values(),
]
#: Headers the filters above meet: HEADERS (which makes all but COSTLIEST
#: true), and HEADERS filled up to the most a message may carry (which makes
#: COSTLIEST true).
HEADER_SETS = [
    HEADERS,
    {
        **HEADERS,
        **{f"h{i:03}": "v" * 100 for i in range(_validate.MAX_HEADERS - len(HEADERS))},
    },
]


@pytest.mark.sync_only
@pytest.mark.parametrize("expression", ACCEPTED)
def test_an_accepted_filter_runs_within_its_static_cost(expression: str) -> None:
    assert _filters.check(expression) == expression
    for headers in HEADER_SETS:
        verdict, steps = _filters.evaluate(expression, headers, "g1", "t")
        if (headers is HEADERS) != (expression in COSTLIEST.values()):
            assert verdict is True, verdict
        assert 0 < steps <= _filters.cost(expression) <= _filters.MAX_COST


@pytest.mark.sync_only
@pytest.mark.parametrize(
    ("expression", "match"),
    [
        ('"a" * 3 == "aaa"', "no operator \\*"),
        ("1 == 1.0", "compares int with double"),
        ('"abc"[0] == "a"', "cannot be indexed"),
        ('[1, "a"] == []', "one type"),
        ('{"a": 1, "b": "c"} == {}', "one type"),
        ("{[1]: 1} == {}", "map keys"),
        ("1 < 2 < 3", "compares bool with int"),
        ("headers.tier", "not boolean"),
        ("headers.all(k, k)", "must be bool"),
        ("[1, 2].map(x, y, x) == []", "takes a variable and an expression"),
        ("[1, 2].map(1, 1) == []", "takes a variable"),
        ("[1, 2].reduce(r, x, 0, r + x) == 3", "reduce"),
        ("dyn(1) == 1", "dyn"),
        ("type(1) == int", "type"),
        ('duration(headers.d) > duration("1s")', "a string literal"),
        ("timestamp(headers.at).getHours(headers.tz) == 1", "a string literal"),
        ('timestamp(headers.at).getHours("Mars/Olympus") == 1', "time zone"),
        ("headers.a.matches(headers.b)", "a string literal"),
        ('headers.a.matches("(")', "missing \\)"),
        ("99999999999999999999 > 0", "out of range"),
        ('duration("forever") > duration("1s")', "invalid"),
        ("headers.n.startsWith(1)", "startsWith"),
        ("group.size(1) == 1", "size"),
        ("Foo{a: 1} == 1", "protocol buffer message"),
        (".headers.tier == 'gold'", "leading dot"),
        ("headers.all(a, headers.exists(b, b == a))", "over headers, up to 128 times"),
        (
            'headers["a"] + headers["b"] + headers["c"] + headers["d"] + headers["e"] + '
            'headers["f"] + headers["g"] + headers["h"] + headers["i"] + headers["j"] + '
            'headers["k"] + headers["l"] + headers["m"] != ""',
            "the limit is 20,000",
        ),
        (
            "[headers.a].map(a, [a + a].map(b, [b + b].map(c, [c + c].map(d, d + d)))) != []",
            "the limit is 20,000",
        ),
        ("x" * 4001, "the limit is 4000"),
    ],
)
def test_what_the_check_refuses(expression: str, match: str) -> None:
    with pytest.raises(novaque.InvalidFilter, match=match):
        _filters.check(expression)


@pytest.mark.sync_only
@pytest.mark.parametrize(
    ("shape", "seed", "least"),
    [("({})", "true", 19), ("!{}", "true", 150), ("{} && true", "true", 150), ("{} + 1", "1", 90)],
)
def test_the_deepest_accepted_filter_runs_from_a_deep_stack(
    shape: str, seed: str, least: int
) -> None:
    """Nesting is bounded by what the evaluator runs: the deepest accepted
    filter of each shape (parentheses, negations, chained operators) evaluates
    from 300 frames down, and one level more is refused."""
    suffix = " > 0" if seed == "1" else ""
    expression, levels = seed, 0
    while True:
        deeper = shape.format(expression)
        try:
            _filters.check(deeper + suffix)
        except novaque.InvalidFilter as exc:
            refusal = str(exc)
            break
        expression, levels = deeper, levels + 1
    assert "nests too deep" in refusal
    assert levels >= least

    def down(frames: int) -> tuple[bool | str, int]:
        return down(frames - 1) if frames else _filters.evaluate(expression + suffix, {}, None, "t")

    verdict, _ = down(300)
    assert isinstance(verdict, bool), verdict
