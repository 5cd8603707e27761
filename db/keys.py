"""Every Redis key, stream and channel name of the project, built in this one module."""

from __future__ import annotations

import re
from dataclasses import dataclass

PRIORITIES = (1, 0)  # read order: high first
REQUEUE_TTL_S = 7 * 86400  # a re-queue waiting for an ack that never comes (its entry lost)
SLOT_ENDED_TTL_S = 3600  # far longer than a renewal call can wait (Keys.slot_ended)
DEFAULT_TENANT = "default"
# A tenant id goes into key names: letters, digits and ``._@-``, 1 to 64 of them.
_TENANT_ID = re.compile(r"[A-Za-z0-9._@-]{1,64}")  # whole (fullmatch: "$" let a newline end one)


CANCEL_ANY = "*"  # a cancel request of a task whose attempt is unknown (its row is gone)


def cancels(value: str | None, attempt: int) -> bool:
    """Whether a cancel request holding ``value`` stops a run of ``attempt``: it names the
    attempt the row had when it was cancelled, so a later attempt (retry, replay, restore,
    resubmit) is never stopped by an older cancel, whatever path published it."""
    if value is None:
        return False
    if value == CANCEL_ANY:
        return True
    try:
        return attempt <= int(value)
    except ValueError:
        return True  # not ours to read: err on the side of the user's request


def check_tenant(tenant_id: object) -> str:
    """``tenant_id`` if it is a valid tenant id, else ``ValueError`` naming the rule."""
    if not isinstance(tenant_id, str) or not _TENANT_ID.fullmatch(tenant_id):
        raise ValueError(f"a tenant id has 1 to 64 letters, digits or ._@- characters, not {tenant_id!r}")
    return tenant_id


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix (``INGEST_KEY_PREFIX``, default ``ingest``)."""

    prefix: str = "ingest"

    def queue(self, priority: int) -> str:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be 0 or 1, not {priority!r}")
        return f"{self.prefix}:queue:{priority}"

    @property
    def queues(self) -> list[str]:
        """The priority streams, high priority first."""
        return [self.queue(p) for p in PRIORITIES]

    def priority_of(self, stream: str) -> int:
        return int(stream.rsplit(":", 1)[1])

    def backlog(self, priority: int, tenant_id: str) -> str:
        """A tenant's waiting work at one priority (a stream without a group): the fair gate
        (``db.streams``) admits it into ``queue(priority)``."""
        return f"{self.queue(priority)}:t:{tenant_id}"

    def ready(self, priority: int) -> str:
        """ZSET of tenants with backlog at ``priority`` and a free slot; the lowest score is the
        longest unserved (scores come from the ``rr`` counter)."""
        return f"{self.prefix}:ready:{priority}"

    @property
    def parked(self) -> str:
        """ZSET of tenants at their running cap, scored by when to look at them again (ms)."""
        return f"{self.prefix}:parked"

    @property
    def rr(self) -> str:
        """The round-robin counter that scores ``ready``."""
        return f"{self.prefix}:rr"

    def running(self, tenant_id: str) -> str:
        """ZSET of a tenant's running slots: member ``{priority}:{entry id}``, score its deadline (ms)."""
        return f"{self.prefix}:tenant:{tenant_id}:running"

    def slot_ended(self, priority: int, entry_id: str) -> str:
        """Set (``SLOT_ENDED_TTL_S``) by the ack or hand-back that ended the slot ``{priority}:{entry
        id}`` of an entry Redis had lost: a lease renewal racing that ack does not take it again."""
        return f"{self.prefix}:slot:ended:{priority}:{entry_id}"

    def limits(self, tenant_id: str) -> str:
        """HASH of a tenant's limit overrides (``max_running``…), mirrored from the ``tenant`` table."""
        return f"{self.prefix}:tenant:{tenant_id}:limits"

    @property
    def limits_mirrored(self) -> str:
        """Set once the limit overrides are mirrored into Redis (the reconciler re-mirrors
        when it is missing: Redis lost its data)."""
        return f"{self.prefix}:tenants:mirrored"

    @property
    def notify(self) -> str:
        """The wake-up stream (``XADD MAXLEN 1``): idle executors block on it."""
        return f"{self.prefix}:notify"

    def result(self, task_id: str) -> str:
        """A finished task's result, expiring (``INGEST_RESULTS_TTL_S``)."""
        return f"{self.prefix}:result:{task_id}"

    @property
    def result_pattern(self) -> str:
        return f"{self.prefix}:result:*"

    @property
    def group(self) -> str:
        return f"{self.prefix}:executors"

    @property
    def dead(self) -> str:
        return f"{self.prefix}:dead"

    @property
    def dead_replayed(self) -> str:
        """Hash of dead-letter entry id → when it was replayed (``ingest dead replay``); its
        fields go with their entries (``ingest dead purge``), like the stream it annotates."""
        return f"{self.prefix}:dead:replayed"

    def executor(self, consumer: str) -> str:
        return f"{self.prefix}:executor:{consumer}"

    @property
    def executor_pattern(self) -> str:
        return f"{self.prefix}:executor:*"

    def cancel(self, task_id: str) -> str:
        """A cancel request; its value names the attempt it cancels (``cancels``)."""
        return f"{self.prefix}:cancel:{task_id}"

    def published(self, task_id: str) -> str:
        """``{stream} {entry id}`` of the task's one live entry; no expiry (it lives exactly as
        long as its entry: the ack deletes it, the reconciler drops one whose entry is gone)."""
        return f"{self.prefix}:published:{task_id}"

    def requeue(self, task_id: str) -> str:
        """The message of a task re-queued while its previous entry was still being processed:
        the ack of that entry publishes it (so publish and ack cannot both win)."""
        return f"{self.prefix}:requeue:{task_id}"

    @property
    def dead_tasks(self) -> str:
        """HASH task id → its dead-letter entry: a task has one dead letter per death."""
        return f"{self.prefix}:dead:tasks"

    @property
    def updates(self) -> str:
        return f"{self.prefix}:updates"

    @property
    def strikes(self) -> str:
        return f"{self.prefix}:strikes"

    def lock(self, name: str) -> str:
        """A short fleet-wide lease (sweeper, reconciler)."""
        return f"{self.prefix}:lock:{name}"

    @property
    def orphan_sightings(self) -> str:
        """HASH ``{task id}:{attempt}`` → when (ms, Redis's clock) a reconcile pass first saw
        that running row with no heartbeat of its owner and no entry. Shared by the fleet's
        passes (whichever executor wins the lock); a field goes when its row stops being such a
        row, and the hash expires a few pass intervals after the last pass that had one (a
        loss of it only restarts the wait)."""
        return f"{self.prefix}:reconcile:orphans"

    @property
    def stats(self) -> str:
        """Fleet counters (e.g. how many rows the reconciler re-published)."""
        return f"{self.prefix}:stats"


# The same names for the Lua scripts that build keys from a tenant id they read (the fair gate
# in ``db.streams``); keep both halves of this module in step.
LUA_KEYS = """
local PRIOS = {'1', '0'}
local function k_queue(prefix, p) return prefix .. ':queue:' .. p end
local function k_backlog(prefix, p, t) return prefix .. ':queue:' .. p .. ':t:' .. t end
local function k_ready(prefix, p) return prefix .. ':ready:' .. p end
local function k_parked(prefix) return prefix .. ':parked' end
local function k_rr(prefix) return prefix .. ':rr' end
local function k_running(prefix, t) return prefix .. ':tenant:' .. t .. ':running' end
local function k_slot_ended(prefix, p, id) return prefix .. ':slot:ended:' .. p .. ':' .. id end
local function k_limits(prefix, t) return prefix .. ':tenant:' .. t .. ':limits' end
local function k_notify(prefix) return prefix .. ':notify' end
local function k_published(prefix, task) return prefix .. ':published:' .. task end
local function k_requeue(prefix, task) return prefix .. ':requeue:' .. task end
local function k_dead_tasks(prefix) return prefix .. ':dead:tasks' end
"""
