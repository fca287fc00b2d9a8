"""kvoffload.tenants: per-tenant counters, and their labels
(kvo_tenant_label: the same as the C connector's metrics)."""
import threading

import pytest

from kvoffload.tenants import DEFAULT, OTHER, TenantCounters, tenant_label


def test_labels_never_show_the_salt_and_tell_tenants_apart():
    salts = ["alice", b"alice", "bob", "a" * 300, "客户甲"]
    labels = [tenant_label(s) for s in salts]
    assert labels[0] == labels[1]                      # a str is its UTF-8 bytes
    assert len(set(labels)) == 4 and all(lab.startswith("t-") and len(lab) == 14 for lab in labels)
    assert not any(str(s) in lab for s, lab in zip(salts, labels) if isinstance(s, str))
    assert tenant_label(None) == tenant_label("") == tenant_label(b"") == DEFAULT


def test_rows_are_bounded_and_no_count_is_lost():
    c = TenantCounters(("asked", "got"), max_tenants=3)
    for i in range(10):
        c.add(f"tenant-{i}", asked=2, got=i % 2)
    c.add(None, asked=1)
    snap = c.snapshot()
    assert set(snap) == {tenant_label("tenant-0"), tenant_label("tenant-1"), tenant_label("tenant-2"), OTHER}
    assert snap[OTHER] == {"asked": 7 * 2 + 1, "got": 4}     # tenants 3..9 and the default
    assert sum(r["asked"] for r in snap.values()) == 21 and sum(r["got"] for r in snap.values()) == 5
    c.add("tenant-1", got=1)                                   # an early tenant keeps its row
    assert c.snapshot()[tenant_label("tenant-1")] == {"asked": 2, "got": 2}
    with pytest.raises(ValueError, match="'hits'.*asked, got"):
        c.add("tenant-1", hits=1)
    with pytest.raises(ValueError, match="max_tenants"):
        TenantCounters(("x",), max_tenants=0)


def test_threads_count_every_add():
    c = TenantCounters(("n",), max_tenants=8)

    def run(t):
        for i in range(2000):
            c.add(f"t{(t + i) % 12}", n=1)
    ts = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    snap = c.snapshot()
    assert sum(r["n"] for r in snap.values()) == 8000 and len(snap) == 9   # 8 rows and "other"


def test_take_deltas_gives_each_increment_once():
    c = TenantCounters(("n", "m"), max_tenants=2)
    assert c.take_deltas() == {}
    c.add("a", n=2)
    c.add(None, m=1)
    assert c.take_deltas() == {tenant_label("a"): {"n": 2}, DEFAULT: {"m": 1}}
    assert c.take_deltas() == {}
    c.add("a", n=1, m=0)
    c.add("b", n=5)                                   # a third tenant: "other"
    assert c.take_deltas() == {tenant_label("a"): {"n": 1}, OTHER: {"n": 5}}
    assert c.snapshot()[tenant_label("a")] == {"n": 3, "m": 0}   # the totals are untouched
