"""The Lua-guarded stream writes: one live entry per task, owner-checked ack, hand-back, renew."""

from __future__ import annotations

from db.gate import Gate
from db.streams import AckItem, Streams, connect
from tests.conftest import _delete_prefix
from tests.lifecycle import rule
from tests.procs import PrivateRedis


def _read(rclient, keys, consumer, stream=None, free=10):
    """What ``consumer`` reads through the fair gate (an executor's read of new entries). No
    tenant has stored limits here: the mirror's mark stands for a complete copy of none."""
    rclient.set(keys.limits_mirrored, "1")
    got = Gate(rclient, keys).dispatch(keys.group, consumer, free, default_max_running=100, slot_ms=60_000)
    return [
        (s, eid, dict(zip(flat[::2], flat[1::2], strict=True)))
        for s, entries in got.reply
        for eid, flat in entries
        if stream is None or s == stream
    ]


@rule("publish.one-live-entry")
def test_publish_is_guarded_by_the_published_key(streams, rclient, keys):
    msgs = [{"id": "a", "priority": 0}, {"id": "b", "priority": 1}, {"id": "a", "priority": 0}]
    ids = streams.publish_many(msgs)
    assert ids[0] and ids[1] and ids[2] is None
    assert rclient.xlen(keys.backlog(0, "default")) == 1 and rclient.xlen(keys.backlog(1, "default")) == 1
    assert rclient.ttl(keys.published("a")) == -1  # it lives exactly as long as its entry


@rule("finish.ack-script")
def test_ack_checks_owner_then_acks_deletes_and_clears_published(streams, rclient, keys):
    streams.publish_many([{"id": "a", "priority": 0}])
    [(stream, eid, _)] = _read(rclient, keys, "c1", keys.queue(0))
    assert rclient.get(keys.published("a")) == f"{stream} {eid}"  # it follows its entry across the gate
    assert streams.ack("c2", [AckItem(stream, eid, "a")]) == [False]
    assert rclient.xlen(stream) == 1
    assert streams.ack("c1", [AckItem(stream, eid, "a")]) == [True]
    assert rclient.xlen(stream) == 0 and not rclient.exists(keys.published("a"))
    assert rclient.xpending(stream, keys.group)["pending"] == 0


@rule("finish.ack-script")
def test_ack_with_reason_dead_letters_in_the_same_step(streams, rclient, keys):
    streams.publish_many([{"id": "a", "priority": 0}])
    [(stream, eid, fields)] = _read(rclient, keys, "c1", keys.queue(0))
    item = AckItem(stream, eid, "a", dead_reason="bad", raw=fields["message"], deliveries=1)
    assert streams.ack("c1", [item]) == [True]
    [(_, dead)] = rclient.xrange(keys.dead)
    assert dead["reason"] == "bad" and dead["task_id"] == "a" and dead["message"] == fields["message"]


@rule("lease.hand-back")
def test_hand_back_republishes_only_when_still_owned(streams, rclient, keys):
    streams.publish_many([{"id": "a", "priority": 0}])
    [(stream, eid, _)] = _read(rclient, keys, "c1", keys.queue(0))
    assert streams.hand_back("c2", stream, eid, {"id": "a", "priority": 0}) is None
    new = streams.hand_back("c1", stream, eid, {"id": "a", "priority": 0})
    backlog = keys.backlog(0, "default")
    assert new and rclient.xlen(stream) == 0
    assert [e for e, _ in rclient.xrange(backlog)] == [new]  # back in line, behind the tenant's others
    assert rclient.get(keys.published("a")) == f"{backlog} {new}"
    assert rclient.xpending(stream, keys.group)["pending"] == 0
    assert rclient.zcard(keys.running("default")) == 0  # its slot went with the entry


@rule("lease.renew-own")
def test_renew_reports_owned_stolen_and_gone(streams, rclient, keys):
    streams.publish_many([{"id": "a", "priority": 0}, {"id": "b", "priority": 0}])
    stream = keys.queue(0)
    [(_, e1, _), (_, e2, _)] = _read(rclient, keys, "c1", stream)
    rclient.xclaim(stream, keys.group, "c2", 0, [e2], justid=True)
    assert streams.renew("c1", [(stream, e1), (stream, e2), (stream, "1-1")]) == [1, 0, -1]


def test_ack_of_many_entries_in_one_call_reads_each_entry_s_arguments(streams, rclient, keys):
    ids = streams.publish_many([{"id": t, "priority": 0} for t in ("a", "b", "c")])
    read = _read(rclient, keys, "c1", keys.queue(0))
    items = [AckItem(s, e, t) for (s, e, _), t in zip(read, ("a", "b", "c"), strict=True)]
    items[1] = AckItem(items[1].stream, items[1].entry_id, "b", dead_reason="bad", raw="{}", deliveries=2)
    assert streams.ack("c1", items) == [True, True, True]
    assert rclient.xlen(keys.queue(0)) == 0 and len(ids) == 3
    assert not any(rclient.exists(keys.published(t)) for t in ("a", "b", "c"))
    [(_, dead)] = rclient.xrange(keys.dead)
    assert dead["task_id"] == "b" and dead["reason"] == "bad" and dead["deliveries"] == "2"


def test_hole17_5_a_dead_letter_without_a_task_id_passes_no_empty_key_an_acl_user_refuses(
    settings, streams, rclient, keys
):
    """Acking the dead letter of a message that names no task passed '' as a key: an ACL user
    confined to the prefix is refused that (NOPERM), and the entry was reclaimed for ever."""
    import uuid

    import redis

    from db.streams import Streams

    user, password = f"t_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    rclient.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", f"~{keys.prefix}:*", f"&{keys.prefix}:*", "+@all"
    )
    try:
        confined = redis.Redis(
            host="127.0.0.1", port=6379, username=user, password=password, decode_responses=True
        )
        mine = Streams(confined, keys)
        eid = rclient.xadd(keys.queue(0), {"message": "{not json"})
        rclient.xreadgroup(keys.group, "c1", {keys.queue(0): ">"}, count=1)
        item = AckItem(keys.queue(0), eid, "", dead_reason="not JSON", raw="{not json", deliveries=1)
        assert mine.ack("c1", [item]) == [True]
        assert rclient.xlen(keys.dead) == 1 and rclient.xlen(keys.queue(0)) == 0
        confined.close()
    finally:
        rclient.execute_command("ACL", "DELUSER", user)


@rule("publish.one-live-entry")
def test_hole2_a_published_key_whose_entry_is_gone_is_found_and_dropped(streams, rclient, keys):
    """Issue 12 hole 2: the published key lives as long as its entry (no expiry); when the entry
    goes without an ack (an operator's XTRIM, a partial restore) the reconciler's check drops it."""
    streams.publish_many([{"id": "a", "priority": 0}, {"id": "b", "priority": 0}])
    rclient.xtrim(
        keys.backlog(0, "default"), maxlen=1, approximate=False
    )  # a's entry is gone, b's is the newest
    assert streams.live_entries(["a", "b", "c"]) == [False, True, False]
    assert not rclient.exists(keys.published("a")) and rclient.exists(keys.published("b"))


def _lose_everything(rclient, keys, streams):
    """Redis restarted without persistence: every key of the prefix gone, the group made again
    (as the executors' read loop makes it)."""
    _delete_prefix(rclient, keys.prefix)
    streams.ensure_group()


def test_a_running_task_whose_entry_redis_lost_takes_its_slot_again_until_its_ack(streams, rclient, keys):
    streams.publish_many([{"id": "a", "priority": 0, "tenant_id": "t1"}])
    [(stream, eid, fields)] = _read(rclient, keys, "c1", keys.queue(0))
    assert fields["tenant"] == "t1"
    _lose_everything(rclient, keys, streams)
    member = f"0:{eid}"
    # a renewal of an entry held but not running takes nothing; a running one's takes its slot
    assert streams.renew("c1", [(stream, eid)]) == [-1]
    assert rclient.zcard(keys.running("t1")) == 0
    assert streams.renew("c1", [(stream, eid)], {(stream, eid): "t1"}) == [-1]
    assert rclient.zrange(keys.running("t1"), 0, -1) == [member]
    # the ack finds the entry pending nowhere: nothing acked, the slot ends for good
    assert streams.ack("c1", [AckItem(stream, eid, "a", tenant="t1")]) == [False]
    assert rclient.zcard(keys.running("t1")) == 0
    # a renewal racing that ack (its list taken while the task still ran) does not take it again
    assert streams.renew("c1", [(stream, eid)], {(stream, eid): "t1"}) == [-1]
    assert rclient.zcard(keys.running("t1")) == 0


def test_a_hand_back_of_an_entry_redis_lost_ends_its_slot_and_publishes_nothing(streams, rclient, keys):
    msg = {"id": "a", "priority": 0, "tenant_id": "t1"}
    streams.publish_many([msg])
    [(stream, eid, _)] = _read(rclient, keys, "c1", keys.queue(0))
    _lose_everything(rclient, keys, streams)
    streams.renew("c1", [(stream, eid)], {(stream, eid): "t1"})
    assert rclient.zcard(keys.running("t1")) == 1
    assert streams.hand_back("c1", stream, eid, msg, "t1") is None  # the reconciler re-publishes its row
    assert rclient.zcard(keys.running("t1")) == 0 and rclient.xlen(keys.backlog(0, "t1")) == 0
    streams.renew("c1", [(stream, eid)], {(stream, eid): "t1"})
    assert rclient.zcard(keys.running("t1")) == 0


def test_an_ack_in_a_group_redis_lost_acks_the_others_of_its_call(streams, rclient, keys):
    streams.publish_many([{"id": "a", "priority": 0}, {"id": "b", "priority": 1}])
    read = {s: e for s, e, _ in _read(rclient, keys, "c1")}
    rclient.delete(keys.queue(1))  # the high-priority stream and its group lost, the other kept
    items = [
        AckItem(keys.queue(1), read[keys.queue(1)], "b"),
        AckItem(keys.queue(0), read[keys.queue(0)], "a"),
    ]
    assert streams.ack("c1", items) == [False, True]
    assert rclient.xpending(keys.queue(0), keys.group)["pending"] == 0


def test_an_entry_acked_while_a_renewal_of_it_waited_takes_no_slot(streams, rclient, keys):
    """The renewal's list was made while the task ran; the ordinary ack came first. The
    executor asks to take a slot again only for an entry found gone twice (LeaseKeeper), but
    the script itself must not take one for an entry whose ack came and went either way."""
    streams.publish_many([{"id": "a", "priority": 0, "tenant_id": "t1"}])
    [(stream, eid, _)] = _read(rclient, keys, "c1", keys.queue(0))
    assert rclient.zcard(keys.running("t1")) == 1
    assert streams.ack("c1", [AckItem(stream, eid, "a", tenant="t1")]) == [True]
    assert rclient.zcard(keys.running("t1")) == 0
    assert streams.renew("c1", [(stream, eid)]) == [-1]  # what the keeper sends for a first sighting
    assert rclient.zcard(keys.running("t1")) == 0


def test_a_full_redis_still_renews_and_acks_beside_a_lost_entry(keys, tmp_path):
    """Under maxmemory Redis refuses a script's first write that may grow memory: the lost
    entry's slot work must not be that first write, or the whole call fails. (A Redis of the
    test's own: the shared one serves other tests meanwhile.)"""
    with PrivateRedis(tmp_path) as server:
        rclient = connect(server.url)
        streams = Streams(rclient, keys)
        streams.ensure_group()
        streams.publish_many([{"id": t, "priority": 0, "tenant_id": "t1"} for t in ("a", "b")])
        [(stream, ea, _), (_, eb, _)] = _read(rclient, keys, "c1", keys.queue(0))
        lost = "1-1"  # sorts first: a gone entry whose task runs here
        rclient.config_set("maxmemory", "1")
        assert streams.renew("c1", [(stream, lost), (stream, ea)], {(stream, lost): "t1"}) == [-1, 1]
        items = [AckItem(stream, lost, "x", tenant="t1"), AckItem(stream, ea, "a", tenant="t1")]
        assert streams.ack("c1", items) == [False, True]
        msg = {"id": "b", "priority": 0, "tenant_id": "t1"}
        assert streams.hand_back("c1", stream, lost, msg, "t1") is None
        rclient.config_set("maxmemory", "0")
        assert rclient.xpending(stream, keys.group)["pending"] == 1  # b, still ours
        rclient.close()
