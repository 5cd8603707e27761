"""Every Redis key, stream and channel name of the project, built in this one module."""

from __future__ import annotations

from dataclasses import dataclass

PRIORITIES = (1, 0)  # read order: high first
PUBLISHED_TTL_S = 7 * 86400


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
        return f"{self.prefix}:cancel:{task_id}"

    def published(self, task_id: str) -> str:
        return f"{self.prefix}:published:{task_id}"

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
    def stats(self) -> str:
        """Fleet counters (e.g. how many rows the reconciler re-published)."""
        return f"{self.prefix}:stats"
