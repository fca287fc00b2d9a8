"""Tests of kvoffload._hot, the vLLM manager's compiled calls into the
cascade, against the real shared library (no vLLM needed: the LookupResult
objects are stand-ins): its keys are the namespace rule's, its answers the
cascade's, its names follow the host tier's events."""
import threading

import numpy as np
import pytest

import kvoffload as k
from kvoffload import _lib as L
from kvoffload import cascade as kc
from kvoffload._hot import Hot

MISS, HIT, PENDING, RETRY = object(), object(), object(), object()
FUNCS = ("kvo_cascade_lookup", "kvo_cascade_prepare_load", "kvo_cascade_complete_load", "kvo_cascade_touch",
         "kvo_cascade_prepare_store", "kvo_cascade_complete_store", "kvo_cascade_store", "kvo_store_drain_events",
         "kvo_store_peek", "kvo_namespace_keys", "kvo_last_error")
NS = (1 << 127) + 12345


def hot(names=None, groups=((7, 0), (9, 1)), ns=NS):
    return Hot(list(groups), (ns & ((1 << 64) - 1), ns >> 64), L.addresses(L.lib, FUNCS),
               (MISS, HIT, PENDING, RETRY), L.KvoError, {} if names is None else names)


def okey(i, group=7, hash_len=32):
    return (i * 0x9E3779B97F4A7C15 % (1 << 64)).to_bytes(8, "little").ljust(hash_len, b"\x5a")[:hash_len] + \
        group.to_bytes(4, "big")


def two_groups():
    return k.Plan(k.Model("t", 16, [dict(name="a", tokens_per_block=16, layers=1, page_bytes=256),
                                    dict(name="b", tokens_per_block=16, layers=1, page_bytes=256)]),
                  blocks_per_chunk=1)


def cascade(chunks=512, file_tier=None, **kw):
    plan = two_groups()
    return kc.Cascade(plan, chunks * plan.max_slot_bytes, file_tier=file_tier, event_capacity=4 * chunks,
                      prefault=False, **kw)


def test_keys_are_the_namespace_rule():
    """A key's chunk key is kvo_namespace_keys(namespace, its block hash, its
    group's index): any hash length, the group from the 4-byte suffix."""
    h = hot()
    keys = [okey(i, g, n) for i, (g, n) in enumerate([(7, 32), (9, 32), (7, 16), (9, 5), (7, 0), (9, 17)])]
    want = np.concatenate([kc.namespace_keys(NS, [x[:-4]], group=0 if x[-4:] == b"\0\0\0\7" else 1)
                           for x in keys])
    assert h.pack(keys) == want.tobytes()
    assert h.pack(()) == b""
    assert h.pack(iter(keys[:2])) == h.pack(keys[:2])  # any iterable
    # another namespace: other keys for the same hashes
    assert hot(ns=NS + 1).pack(keys[:1]) != h.pack(keys[:1])
    # a repeated vLLM group id: the last index wins
    assert np.frombuffer(hot(groups=[(7, 0), (7, 3)]).pack([okey(1)]), k.KEY_DTYPE)["group"][0] == 3


def test_pack_refuses_bad_keys():
    h = hot()
    with pytest.raises(k.KvoError) as e:
        h.pack([okey(1), okey(2, group=8)])
    assert e.value.code == L.KVO_EINVAL and "group 8" in e.value.message and e.value.func == "manager"
    with pytest.raises(k.KvoError):
        h.pack([b"\0\7"])  # shorter than a group id
    with pytest.raises(TypeError, match="bytes"):
        h.pack([bytearray(okey(1))])
    with pytest.raises(TypeError):
        h.pack(5)
    with pytest.raises(TypeError):
        Hot([(7, 0)], (0, 0), {}, (MISS, HIT, PENDING, RETRY), L.KvoError)  # too few arguments
    with pytest.raises(KeyError):
        Hot([(7, 0)], (0, 0), {}, (MISS, HIT, PENDING, RETRY), L.KvoError, {})  # no addresses
    with pytest.raises(OverflowError):
        hot(groups=[(1 << 32, 0)])
    with pytest.raises(OverflowError):
        Hot([(7, 0)], (1 << 64, 0), L.addresses(L.lib, FUNCS), (MISS, HIT, PENDING, RETRY), L.KvoError, {})


@pytest.mark.parametrize("n", [5, 300])  # the stack path and the heap path (GIL released)
def test_calls_answer_as_the_cascade(n):
    c = cascade()
    names = {}
    h = hot(names)
    keys = [okey(i, 7 if i % 3 else 9) for i in range(n)]
    stored = n // 2 + 1
    to_store, offs, groups, refused, runs = h.prepare_store(c._h, keys[:stored], False)
    assert to_store is not None and len(to_store) == stored and refused == 0 and runs == []
    assert len(names) == stored  # the keys being stored, by record
    h.complete_store(c._h, keys[:stored - 1], True)  # the last one stays PENDING
    assert h.lookup(c._h, keys[0], None) is HIT
    assert h.lookup(c._h, keys[stored - 1], None) is PENDING
    assert h.lookup(c._h, keys[stored], None) is MISS
    assert h.prefix_hits(c._h, keys, None) == stored - 1
    assert h.prefix_hits(c._h, keys[stored:], None) == 0
    assert h.prefix_hits(c._h, [], None) == 0
    lo, lg = h.prepare_load(c._h, keys[:stored - 1])
    assert isinstance(lo, bytearray) and isinstance(lg, bytearray)  # writable arrays for the spec
    assert np.frombuffer(lo, np.uint64).tolist() == np.frombuffer(offs, np.uint64)[:stored - 1].tolist()
    ck = np.frombuffer(h.pack(keys[:stored - 1]), k.KEY_DTYPE)
    assert np.frombuffer(lg, np.uint32).tolist() == ck["group"].tolist()
    host = c.host_store()
    assert host.stats()["pinned"] == stored - 1
    h.touch(c._h, keys[:stored - 1])
    h.complete_load(c._h, keys[:stored - 1])
    assert host.stats()["pinned"] == 0
    assert h.prepare_load(c._h, []) == (bytearray(), bytearray())
    h.touch(c._h, ())
    # the stores that completed are the host tier's STORED events, with vLLM's keys
    assert h.drain(c._h, True) == [(1, keys[:stored - 1])]
    c.close()


def test_errors_raise_kvoerror():
    c = cascade()
    h = hot()
    with pytest.raises(k.KvoError) as e:
        h.complete_load(c._h, [okey(1)])  # not pinned
    assert e.value.func == "kvo_cascade_complete_load" and e.value.message
    with pytest.raises(k.KvoError) as e:
        h.prepare_store(c._h, [okey(1), okey(1)], False)  # a duplicate key
    assert e.value.code == L.KVO_EINVAL and e.value.func == "kvo_cascade_prepare_store"
    with pytest.raises(ValueError):
        h.prepare_store(c._h, [], False)
    with pytest.raises(TypeError):
        h.prepare_store(c._h, (okey(1),), False)
    c.close()
    for call in (lambda: h.lookup(c._h, okey(1), None), lambda: h.prefix_hits(c._h, [okey(1)], None),
                 lambda: h.touch(c._h, [okey(1)]), lambda: h.prepare_load(c._h, [okey(1)])):
        with pytest.raises(k.KvoError) as e:  # a closed cascade's handle is None: NULL, refused
            call()
        assert e.value.code == L.KVO_EINVAL
    assert h.drain(c._h, True) == []
    with pytest.raises(TypeError):
        h.lookup("cascade", okey(1), None)
    with pytest.raises(TypeError):
        h.lookup(None)


def test_prepare_store_evictions_and_names():
    c = cascade(chunks=8)
    names = {}
    h = hot(names)
    keys = [okey(i) for i in range(8)]
    r = h.prepare_store(c._h, keys, False)
    assert r[0] is keys  # all to store: the caller's list itself
    h.complete_store(c._h, keys, True)
    h.prepare_load(c._h, keys[:1])  # pinned
    more = [okey(i) for i in range(100, 103)]
    to_store, offs, groups, refused, runs = h.prepare_store(c._h, more + keys[1:2], False)
    # the present key is not stored again; three LRU victims, keys[0] pinned
    assert to_store == more and refused == 0
    assert runs == [(2, keys[1:4])] or runs == [(2, keys[2:5])], runs
    evicted = runs[0][1]
    recs = h.pack(evicted)
    assert not {recs[24 * i:24 * i + 24] for i in range(3)} & set(names)  # evicted keys leave names
    assert len(names) == 8
    # failed stores leave names at once, and no event names them
    h.complete_store(c._h, more[:1], False)
    assert len(names) == 7
    assert h.drain(c._h, True) == []
    # keys vLLM completes that are not being stored are left out (KVO_ESTATE: one by one)
    h.complete_store(c._h, more[1:] + [okey(999)], True)
    assert h.drain(c._h, True) == [(1, more[1:])]
    # no room at all: every key refused, nothing stored
    c2 = cascade(chunks=2)
    h2 = hot({})
    h2.prepare_store(c2._h, [okey(1), okey(2)], False)
    to_store, _, _, refused, _ = h2.prepare_store(c2._h, [okey(3)], False)
    assert to_store == [] and refused == 1
    c2.close()
    c.close()


def test_lookup_retries_a_lower_tier_key_it_cannot_promote_yet(tmp_path):
    """A file-tier chunk: the lookup starts its promotion (HIT_PENDING, the
    key in names), HIT once it landed; a file write still queued is RETRY."""
    plan = two_groups()
    ft = k.FileTier(str(tmp_path), plan, 1 << 24, io_threads=1)
    c = kc.Cascade(plan, 4 * plan.max_slot_bytes, file_tier=ft, event_capacity=64, prefault=False)
    names = {}
    h = hot(names)
    keys = [okey(i) for i in range(8)]
    for part in (keys[:4], keys[4:]):  # the second half evicts the first from the 4 host slots
        h.prepare_store(c._h, part, False)
        h.complete_store(c._h, part, True)
    c.flush(20000)
    h.drain(c._h, False)
    assert len(names) == 4
    assert h.lookup(c._h, keys[0], None) is PENDING  # promotion started
    assert len(names) == 5
    for _ in range(400):
        if len(c.poll()):
            break
        c.wait_events(50)
    assert h.lookup(c._h, keys[0], None) is HIT
    assert h.drain(c._h, True)[-1] == (1, keys[:1])  # the promoted chunk is stored in the host tier
    c.close()
    ft.close()


def test_threads_share_one_hot():
    c = cascade()
    h = hot()
    keys = [okey(i) for i in range(40)]
    h.prepare_store(c._h, keys, False)
    h.complete_store(c._h, keys, True)
    errors = []

    def work():
        try:
            for _ in range(200):
                assert h.prefix_hits(c._h, keys * 10, None) == 400
                h.prepare_load(c._h, keys)
                h.complete_load(c._h, keys)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == [] and c.host_store().stats()["pinned"] == 0
    c.close()


@pytest.mark.vllm
def test_vllm_manager_without_the_module_says_how_to_build_it():
    import importlib.util
    import subprocess
    import sys
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here")
    code = ("import sys; sys.modules['kvoffload._hot'] = None\n"
            "try:\n    import kvoffload.vllm.manager\nexcept ImportError as e:\n    print('ImportError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert "ImportError" in out and "tools/test-python.sh" in out and "pip install ./python" in out
    import kvoffload  # the rest of the package never needs it
    assert kvoffload.Store
