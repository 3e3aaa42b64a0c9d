"""Per-tenant quotas: stored bytes, sessions, checkpoints per session (0 = none).

Every check runs before the write it guards stores anything, so a refused
write leaves the session exactly as it was: RESOURCE_EXHAUSTED, reason
QUOTA_EXCEEDED, the quota named in the message and in the error's metadata
(``quota``, ``limit``, ``usage``).

Stored bytes are the tenant's objects and session journals, as
GetStoreStats counts them, read from running counters (`TenantStore.stored_bytes`)
rather than by walking the store. Writes of a tenant's sessions run in
parallel, each checked against the usage it sees: together they may overshoot
the quota by what they add at once. Deleting frees journal bytes at once and
object bytes at the next CollectGarbage, so deletions are never refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratad.errors import ResourceExhaustedError
from stratad.store.tenant import TenantStore


@dataclass(frozen=True)
class Quotas:
    """The limits of every tenant (0 = no limit); config keys in parentheses."""

    tenant_stored_bytes: int = 0  # max_tenant_stored_bytes
    tenant_sessions: int = 0  # max_tenant_sessions
    session_checkpoints: int = 0  # max_session_checkpoints

    def check_stored_bytes(self, tenant: TenantStore, adding: int = 0) -> None:
        """Refuse a write of about `adding` bytes that the tenant's quota has no room for."""
        limit = self.tenant_stored_bytes
        if not limit:
            return
        usage = tenant.stored_bytes
        # Every write adds at least a journal record: a full tenant takes nothing more.
        if usage + max(adding, 1) > limit:
            raise quota_exceeded(
                "max_tenant_stored_bytes",
                limit,
                usage,
                f"tenant {tenant.name!r} stores {usage} bytes and this write adds about "
                f"{adding}; delete sessions or checkpoints, then run CollectGarbage",
            )

    def check_sessions(self, tenant: str, existing: int) -> None:
        """Refuse a new session of a tenant that has `existing` sessions."""
        limit = self.tenant_sessions
        if limit and existing + 1 > limit:
            raise quota_exceeded(
                "max_tenant_sessions", limit, existing, f"tenant {tenant!r} has {existing} sessions"
            )

    def check_checkpoints(self, session_id: str, existing: int, after: int) -> None:
        """Refuse a write that leaves a session with `after` checkpoints (from `existing`)."""
        limit = self.session_checkpoints
        if limit and after > limit and after > existing:
            raise quota_exceeded(
                "max_session_checkpoints",
                limit,
                existing,
                f"session {session_id!r} holds {existing} checkpoints and this write "
                f"would leave {after}; delete or prune checkpoints, or set retention",
            )


def quota_exceeded(quota: str, limit: int, usage: int, detail: str) -> ResourceExhaustedError:
    return ResourceExhaustedError(
        f"quota {quota} ({limit}) exceeded: {detail}",
        reason="QUOTA_EXCEEDED",
        metadata={"quota": quota, "limit": str(limit), "usage": str(usage)},
    )


__all__ = ["Quotas", "quota_exceeded"]
