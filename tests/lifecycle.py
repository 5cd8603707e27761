"""The rules of shared/LIFECYCLE.md, each under a name its tests carry.

A test names the rules it proves with ``@rule("publish.one-live-entry", ...)`` (a
``pytest.mark.lifecycle``). ``tests/test_lifecycle_rules.py`` fails when a rule here has no test
naming it, or a test names a rule that is not here; ``pytest -m lifecycle`` runs them all and
``pytest --collect-only -q -m lifecycle`` lists them. The text is the document's, shortened; where
the code deliberately differs from the document, the rule says what the code does and README.md
("Task lifecycle") says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

RULES: dict[str, str] = {
    # States
    "states.progress": "progress is 0…1 while queued or running, 1 done, -1 failed, cancelled or dead",
    # Facts to build on (the Redis and MySQL behaviour the design relies on, checked on the servers)
    "fact.xreadgroup-count-per-stream": "XREADGROUP's COUNT applies to each stream named, not to the call",
    "fact.reread-counts-a-delivery": "re-reading pending entries with id 0, or XAUTOCLAIM without JUSTID, "
    "adds a delivery; XCLAIM/XAUTOCLAIM with JUSTID add none; XCLAIM takes an entry from a live owner",
    "fact.xack-any-consumer": "XACK takes no consumer; XGROUP DELCONSUMER drops that consumer's pending entries",
    "fact.found-rows": "connections use CLIENT.FOUND_ROWS so a fenced UPDATE reports matched, not changed, rows",
    # Publish
    "publish.rows-first": "rows and bytes are committed before any message is published",
    "publish.one-live-entry": "one Lua script publishes only if ingest:published:{task} is absent; the key "
    "names the entry, has no expiry and goes with the ack: at most one live entry per task",
    "publish.takeover-checks-owner": "start-up takeover and the orphan check re-read entries without taking "
    "a task from a live owner, and what they re-read counts toward the delivery cap",
    "publish.cancel-names-attempt": "a cancel names the attempt it cancels; a later attempt is never stopped "
    "by an older cancel",
    "publish.failure-keeps-rows-queued": "if publishing fails after the commit, the call raises and the rows "
    "stay queued",
    "publish.generations": "a document's id derives from its knowledge base and name; each submission is a "
    "new generation with its own task ids; older unfinished tasks are cancelled",
    "publish.digest-reuse": "a task whose digest equals a finished task of the same document takes over "
    "its chunks and is done without parsing",
    "publish.refusals": "unreadable, empty or too large files are refused by name at submit, the others "
    "enqueued, exit 1; content problems fail the task",
    # Read
    "read.heartbeat-first": "the heartbeat is written before the first read; a live consumer name is refused",
    "read.own-pending-at-start": "at start only, own pending entries are taken over (past the cap: dead "
    "letter), before new ones",
    "read.no-reread-after-reconnect": "after a reconnect nothing is re-read; running tasks finish and are acked",
    "read.new-entries-free-slots": "then only new entries, high priority first, never more than the free slots",
    # Validate and claim
    "validate.one-query": "one query validates a read batch, one UPDATE claims it",
    "validate.drop-rules": "no row, a terminal row or a held row: the entry is acked and nothing runs",
    "validate.bad-messages": "not a message of the contract: dead letter; unknown task_type: row dead and "
    "dead letter",
    "validate.duplicates": "running under another live consumer and read as new: a duplicate, acked; an "
    "entry that came by reclaim takes over",
    "validate.strike-holds": "a matching strike sets the row held, fenced on queued and the rule active; acked",
    "claim.fenced": "the claim raises the attempt; every later write of the run is fenced by it",
    "claim.progress-monotonic": "progress never goes down and never touches a terminal row",
    # Finish
    "finish.one-transaction": "one transaction locks the document, writes the fenced terminal state and "
    "recomputes the document; a done generation removes older generations' chunks",
    "finish.ack-script": "then one Lua script checks ownership, XACKs, XDELs and drops the published key "
    "(dead letter in the same step); then the event on ingest:updates",
    "finish.lost-write": "a fenced write that matched nothing re-reads the row: terminal under my attempt "
    "is success; otherwise the run lost the task and writes nothing more",
    "finish.watchers-read-db": "--wait and every watcher read the database; pub/sub only wakes them early",
    # Errors
    "errors.retryable": "retryable errors are retried in place with backoff, the slot kept, a line per try",
    "errors.permanent": "permanent errors fail the row at once with the reason, no dead letter; retry "
    "re-queues with a fresh publish",
    "errors.dead-letters": "dead letters keep message, reason, deliveries and time; only purge removes them; "
    "replay sets the row queued, then publishes; a row becomes dead only from queued or running",
    # Leases, reclaim, hand-back, reconcile
    "lease.renew-own": "renew only entries still owned; stolen: the copy stops and writes nothing; gone: "
    "the task runs on and finishes",
    "lease.reclaim": "reclaim takes no more than the free slots, counts from XPENDING; past the cap it is "
    "dead-lettered after validation (a done row just acked)",
    "lease.hand-back": "tasks still running after the grace go back to queued (fenced, hand-back count "
    "raised) and are republished only if the entry is still ours; hand-backs count toward the cap",
    "lease.reconciler": "queued past the grace without a published key: published again; running under a "
    "dead owner without one: queued and published; chunks of cancelled tasks nobody runs removed",
    "lease.consumer-removal": "a consumer leaves the group only with no pending entry and no heartbeat",
    # Cancel, strikes, chunks
    "cancel.rows-then-keys": "cancel sets rows first, then expiring cancel keys; a running task stops "
    "within 2 s and its chunks are removed",
    "strikes.mirror-and-restore": "strike rules live in a table, mirrored with a version; executors reload "
    "on reconnect and when the version moves; restore deactivates first, then queues and publishes",
    "chunks.deterministic-ids": "chunk ids derive from the task id and position: a rerun overwrites its own",
    # Keys
    "keys.ttl": "streams, the dead-letter stream and the strike mirror have no TTL; every per-task or "
    "per-executor key has one (the published key excepted: it lives exactly as long as its entry)",
}


def rule(*names: str) -> Callable[[Any], Any]:
    """Mark a test as proving these rules of the lifecycle."""
    unknown = [n for n in names if n not in RULES]
    if unknown:
        raise KeyError(f"no lifecycle rule named {unknown}")
    return pytest.mark.lifecycle(*names)
