"""Per-tenant counters: what each tenant asked of the tiers and got.

A tenant is what an engine names per request to keep its chunks apart:
vLLM's cache_salt, SGLang's extra_key (or cache_salt), LMCache's salt.  The
namespace already keeps tenants' chunks apart (kvo_namespace_id); these
counters say how each tenant fares: lookups, hits, stores.

Labels.  A salt is often a secret (vLLM's cache_salt guards against
prefix-timing attacks), so a tenant is never shown by its salt: its label is
kvo_tenant_label's, "t-" and 12 hex digits of a hash of the salt's bytes,
the same as the C connector's metrics (an operator who knows a salt
computes its label with tenant_label); requests without one count under
"default".

Bounds.  Tenants come and go and a salt may be per user, so the table keeps
rows for the first `max_tenants` tenants it sees (default 32, as the C
connector's KVO_CONNECTOR_TENANTS) and counts every
later one under "other": memory and the stats' size stay bounded, and no
count is lost (the rows sum to the totals).

Thread rule: add and snapshot may be called from any thread (one lock, held
for a few dictionary operations, never while calling anything else).
"""
from __future__ import annotations

import re
import threading
from typing import Union

from .cascade import tenant_label

DEFAULT = "default"
OTHER = "other"

Tenant = Union[None, str, bytes]


class TenantCounters:
    """Counters by tenant label (module doc).  fields: the counters each row
    has, all starting at 0; add() with another name is a ValueError."""

    def __init__(self, fields: tuple[str, ...], max_tenants: int = 32) -> None:
        if max_tenants < 1:
            raise ValueError(f"TenantCounters: max_tenants must be at least 1, not {max_tenants}")
        self.fields = tuple(fields)
        self.max_tenants = max_tenants
        self._rows: dict[str, dict[str, int]] = {}
        self._labels: dict[Tenant, str] = {}   # memo of tenant_label, as bounded as the rows
        self._sent: dict[str, dict[str, int]] = {}   # the rows as the last take_deltas saw them
        self._lock = threading.Lock()

    def _row_label(self, tenant: Tenant) -> str:
        """The row a tenant counts under: its label, or "other" once
        max_tenants other tenants have rows.  Lock held."""
        lab = self._labels.get(tenant)
        if lab is not None:
            return lab
        lab = tenant_label(tenant)
        if lab not in self._rows:
            if len(self._rows) >= self.max_tenants:
                lab = OTHER
            self._rows.setdefault(lab, dict.fromkeys(self.fields, 0))
        if len(self._labels) < 4 * self.max_tenants:
            self._labels[tenant] = lab
        return lab

    def add(self, tenant: Tenant, **deltas: int) -> None:
        """Add deltas to the tenant's row (its label's, or "other")."""
        bad = [f for f in deltas if f not in self.fields]
        if bad:
            raise ValueError(f"TenantCounters: no counter {bad[0]!r} (counters: {', '.join(self.fields)})")
        with self._lock:
            row = self._rows[self._row_label(tenant)]
            for f, d in deltas.items():
                row[f] += int(d)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A copy: label -> counters."""
        with self._lock:
            return {lab: dict(row) for lab, row in self._rows.items()}

    def take_deltas(self) -> dict[str, dict[str, int]]:
        """What each row gained since the last take_deltas (rows and
        counters that did not change are left out): for a metrics sink that
        adds increments (vLLM's Prometheus counters)."""
        with self._lock:
            out: dict[str, dict[str, int]] = {}
            for lab, row in self._rows.items():
                was = self._sent.setdefault(lab, dict.fromkeys(self.fields, 0))
                d = {f: row[f] - was[f] for f in self.fields if row[f] != was[f]}
                if d:
                    out[lab] = d
                    was.update(row)
            return out


_LABEL = re.compile(r"(default|t-[0-9a-f]{12})")


def check_label(label: object, what: str = "tenant") -> str:
    """label, when it is one tenant_label gives ("default" or "t-" and 12
    hex digits); else ValueError (never echoing it: a salt put there by
    mistake stays out of logs)."""
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        raise ValueError(f"{what}: a key is not a tenant label (\"default\" or \"t-\" and 12 hex digits: "
                         "kvoffload.tenants.tenant_label of the salt, as the per-tenant metrics show it)")
    return label


__all__ = ["DEFAULT", "OTHER", "TenantCounters", "check_label", "tenant_label"]
