"""Tests of kvoffload._hot, the vLLM manager's compiled hot calls, against the
real shared library and against the packing rule it replaced (no vLLM
needed: the LookupResult objects are stand-ins)."""
import ctypes
import threading

import numpy as np
import pytest

import kvoffload as k
from kvoffload import _lib as L
from kvoffload._hot import Hot

MISS, HIT, PENDING = object(), object(), object()
FUNCS = ("kvo_store_lookup", "kvo_store_prepare_load", "kvo_store_complete_load", "kvo_store_touch",
         "kvo_store_prepare_store", "kvo_store_complete_store", "kvo_last_error")
CODES = (L.KVO_EINVAL, L.KVO_ERANGE, L.KVO_ENOSPC)


def hot(groups=((7, 0), (9, 1))):
    return Hot(list(groups), L.addresses(L.lib, FUNCS), (MISS, HIT, PENDING), L.KvoError, CODES)


def old_pack(key, sfx):
    """The manager's packing before kvoffload._hot (python, per key)."""
    h = key[:-4]
    if len(h) != 16:
        h = h[:16].ljust(16, b"\0")
    return h + sfx[key[-4:]]


def okey(i, group=7, hash_len=32):
    return (i * 0x9E3779B97F4A7C15 % (1 << 64)).to_bytes(8, "little").ljust(hash_len, b"\x5a")[:hash_len] + \
        group.to_bytes(4, "big")


def store_of_two_groups():
    plan = k.Plan(k.Model("t", 16, [dict(name="a", tokens_per_block=16, layers=1, page_bytes=256),
                                    dict(name="b", tokens_per_block=16, layers=1, page_bytes=256)]),
                  blocks_per_chunk=1)
    return k.Store(plan, 512 * plan.max_slot_bytes)


def test_pack_is_the_old_rule():
    h = hot()
    sfx = {(7).to_bytes(4, "big"): b"\0\0\0\0\0\0\0\0", (9).to_bytes(4, "big"): b"\1\0\0\0\0\0\0\0"}
    keys = [okey(i, g, n) for i, (g, n) in enumerate([(7, 32), (9, 32), (7, 16), (9, 5), (7, 0), (9, 17)])]
    assert h.pack(keys) == b"".join(old_pack(x, sfx) for x in keys)
    assert h.pack(()) == b""
    assert h.pack(iter(keys[:2])) == h.pack(keys[:2])  # any iterable
    # a repeated vLLM group id: the last index wins (as the dict it replaced)
    assert hot([(7, 0), (7, 3)]).pack([okey(1)])[16:20] == (3).to_bytes(4, "little")


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
        Hot([(7, 0)], {}, (MISS, HIT, PENDING), L.KvoError)  # too few arguments
    with pytest.raises(KeyError):
        Hot([(7, 0)], {}, (MISS, HIT, PENDING), L.KvoError, CODES)  # no addresses
    with pytest.raises(OverflowError):
        Hot([(1 << 32, 0)], L.addresses(L.lib, FUNCS), (MISS, HIT, PENDING), L.KvoError, CODES)


@pytest.mark.parametrize("n", [5, 300])  # the stack path and the heap path (GIL released)
def test_calls_match_the_store(n):
    s = store_of_two_groups()
    h = hot()
    keys = [okey(i, 7 if i % 3 else 9) for i in range(n)]
    ck = np.frombuffer(h.pack(keys), dtype=k.KEY_DTYPE).copy()
    stored = n // 2 + 1
    need, slots, _, _ = s.prepare_store(ck[:stored])
    assert need.all()
    s.complete_store(ck[:stored - 1])  # the last one stays PENDING
    assert h.lookup(s._h, keys[0]) is HIT
    assert h.lookup(s._h, keys[stored - 1]) is PENDING
    assert h.lookup(s._h, keys[stored]) is MISS
    assert h.prefix_hits(s._h, keys) == stored - 1
    assert h.prefix_hits(s._h, keys[stored:]) == 0
    assert h.prefix_hits(s._h, []) == 0
    offs, groups = h.prepare_load(s._h, keys[:stored - 1])
    assert isinstance(offs, bytearray) and isinstance(groups, bytearray)  # writable arrays for the spec
    assert np.frombuffer(offs, np.uint64).tolist() == slots["offset"][:stored - 1].tolist()
    assert np.frombuffer(groups, np.uint32).tolist() == ck["group"][:stored - 1].tolist()
    assert s.stats()["pinned"] == stored - 1
    h.touch(s._h, keys[:stored - 1])
    h.complete_load(s._h, keys[:stored - 1])
    assert s.stats()["pinned"] == 0
    assert h.prepare_load(s._h, []) == (bytearray(), bytearray())
    h.touch(s._h, ())
    s.close()


def test_store_errors_raise_kvoerror():
    s = store_of_two_groups()
    h = hot()
    with pytest.raises(k.KvoError) as e:
        h.complete_load(s._h, [okey(1)])  # not pinned
    assert e.value.func == "kvo_store_complete_load" and e.value.message
    s.close()
    for call in (lambda: h.lookup(s._h, okey(1)), lambda: h.prefix_hits(s._h, [okey(1)]),
                 lambda: h.touch(s._h, [okey(1)]), lambda: h.prepare_load(s._h, [okey(1)])):
        with pytest.raises(k.KvoError) as e:  # a closed store's handle is None: NULL, refused
            call()
        assert e.value.code == L.KVO_EINVAL
    with pytest.raises(TypeError):
        h.lookup("store", okey(1))
    with pytest.raises(TypeError):
        h.lookup(None)


def test_prepare_store_and_names():
    s = store_of_two_groups()  # room for 512 chunks
    h = hot()
    names = {}
    keys = [okey(i) for i in range(4)]
    recs = h.pack(keys)
    ck = np.frombuffer(recs, dtype=k.KEY_DTYPE).copy()
    s.prepare_store(ck[1:2])  # present (PENDING): not to store again
    buf, to_store, idx, offs, groups, evicted, ev_recs, ev_offs = h.prepare_store(s._h, keys, names)
    assert buf == recs and to_store == [keys[0], keys[2], keys[3]] and idx == [0, 2, 3]
    assert (evicted, ev_recs, ev_offs) == ([], b"", b"")
    assert names == {recs[24 * i:24 * i + 24]: keys[i] for i in (0, 2, 3)}
    assert np.frombuffer(groups, np.uint32).tolist() == [0, 0, 0]
    assert len(set(np.frombuffer(offs, np.uint64).tolist())) == 3
    assert h.complete_store(s._h, recs, True) == 0
    assert h.complete_store(s._h, b"", True) == 0
    assert h.complete_store(s._h, h.pack([okey(99)]), True) == L.KVO_ESTATE  # not PENDING: the code, not raised
    with pytest.raises(TypeError):
        h.complete_store(s._h, recs[:5], True)
    more = [okey(i) for i in range(4, 8)]
    r = h.prepare_store(s._h, more, names)
    assert r[1] is more and r[2] is None  # all to store: the caller's list itself
    # a full store evicts: the evicted records' names come back, and their slots
    s.complete_store(np.frombuffer(r[0], dtype=k.KEY_DTYPE).copy())
    big = [okey(i, 9) for i in range(1000, 1000 + 508)]  # 8 stored + 508 > 512: evicts 4
    before = dict(names)
    buf, to_store, idx, offs, groups, evicted, ev_recs, ev_offs = h.prepare_store(s._h, big, names)
    assert len(ev_recs) == 24 * 4 and len(ev_offs) == 8 * 4  # over STACK_KEYS: the heap path
    recs_ev = [ev_recs[i:i + 24] for i in range(0, len(ev_recs), 24)]
    # keys[1] was stored past the names (s.prepare_store): evicted, but no name to give back
    assert evicted == [before[x] for x in recs_ev if x in before] and len(evicted) == 3
    assert not set(recs_ev) & set(names)
    assert np.frombuffer(groups, np.uint32).tolist() == [1] * 508
    # no room at all (everything PENDING): None, nothing changed
    assert h.prepare_store(s._h, [okey(i, 9) for i in range(5000, 5100)], names) is None
    with pytest.raises(k.KvoError) as e:
        h.prepare_store(s._h, [okey(1), okey(1)], {})  # a duplicate key
    assert e.value.code == L.KVO_EINVAL and e.value.func == "kvo_store_prepare_store"
    with pytest.raises(ValueError):
        h.prepare_store(s._h, [], {})
    with pytest.raises(TypeError):
        h.prepare_store(s._h, tuple(keys), {})
    buf = ctypes.create_string_buffer(recs[24:72] + recs[:24] + bytes(24))
    names = {recs[24 * i:24 * i + 24]: keys[i] for i in range(4)}
    assert h.forget(names, ctypes.addressof(buf), 4) == [keys[1], keys[2], keys[0]]  # unknown record skipped
    assert list(names.values()) == [keys[3]]
    assert h.forget(names, 0, 0) == []
    with pytest.raises(TypeError):
        h.forget([], ctypes.addressof(buf), 1)
    s.close()


def test_threads_share_one_hot():
    s = store_of_two_groups()
    h = hot()
    keys = [okey(i) for i in range(40)]
    ck = np.frombuffer(h.pack(keys), dtype=k.KEY_DTYPE).copy()
    s.prepare_store(ck)
    s.complete_store(ck)
    errors = []

    def work():
        try:
            for _ in range(200):
                assert h.prefix_hits(s._h, keys * 10) == 400
                h.prepare_load(s._h, keys)
                h.complete_load(s._h, keys)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == [] and s.stats()["pinned"] == 0
    s.close()


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
