"""The Python boundary against bad input and misuse (issue 25 items 1, 4, 6, 8):

 - item 1: batched calls check that address arrays agree with the keys in
   length (ValueError naming both), dtype and shape before any C call;
 - item 4: a password in a Redis URL appears in no exception, repr or
   attribute; redact_url() is the helper the vLLM spec logs its URL through;
 - item 6: a closed Arena refuses view(), views taken before close() stay
   valid, and close() during calls in other threads waits for them (or they
   get KVO_ECLOSED): never a crash, never a hang;
 - item 8: ints out of the C field's range, wrong types and None raise
   OverflowError / TypeError / ValueError naming the parameter.

Cases that crashed the interpreter before the fixes run in a subprocess, so
that a crash is a failed test and not a dead test run."""
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvoffload as k
from kvoffload import _lib as L
from kvoffload import core


def small_plan(bpc=2):
    return k.Plan(k.Model("sec", 16, [dict(name="full", tokens_per_block=16, layers=2, page_bytes=1024)]),
                  blocks_per_chunk=bpc)


def run_isolated(code, timeout=120):
    """Run code in a fresh interpreter; it must print OK as its last line."""
    prog = "import numpy as np, threading, time\nimport kvoffload as k\nfrom kvoffload import _lib as L\n"
    prog += "def small_plan(bpc=2):\n"
    prog += "    return k.Plan(k.Model('sec', 16, [dict(name='full', tokens_per_block=16, layers=2, " \
            "page_bytes=1024)]), blocks_per_chunk=bpc)\n"
    prog += textwrap.dedent(code) + "\nprint('OK')\n"
    try:
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout} s: {e.stdout} {e.stderr}")
    assert r.returncode == 0, f"exit {r.returncode} (negative: killed by that signal)\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip().endswith("OK"), r.stdout + r.stderr


def redis_url():
    a = os.environ.get("KVO_TEST_REDIS")
    if not a:
        pytest.skip("KVO_TEST_REDIS not set (tools/test-python.sh starts a Redis Cluster when redis-server exists)")
    return f"redis://{a}"


def remote_tier(plan, **kw):
    try:
        return k.RemoteTier(redis_url(), plan, key_prefix=f"pysec{os.getpid()}", **kw)
    except k.KvoError as e:
        if e.code == L.KVO_ENOTSUP:
            pytest.skip("library built without hiredis")
        raise


# ------------------------------------------------ item 1: short arrays --

def test_file_tier_short_address_list_raises(tmp_path):
    run_isolated(f"""
        p = small_plan()
        g = p.groups[0]
        ft = k.FileTier({str(tmp_path)!r}, p, 1 << 22)
        src = k.Arena(4 * g["slot_bytes"])
        keys = k.make_keys([1, 2, 3, 4], 0)
        for call, addrs in ((ft.write, [src.base] * 2), (ft.read, np.array([src.base], dtype=np.uintp)),
                            (ft.write, [])):
            try:
                call(keys, addrs)
            except ValueError as e:
                assert "4" in str(e) and str(len(addrs)) in str(e), e
            else:
                raise AssertionError("no ValueError for %d addresses and 4 keys" % len(addrs))
        assert ft.flush(10000) == 0
        assert ft.stats()["writes"] == 0  # nothing was queued
        ft.close()
    """)


def test_address_array_dtype_and_shape_checked(tmp_path):
    p = small_plan()
    g = p.groups[0]
    ft = k.FileTier(str(tmp_path), p, 1 << 22)
    src = k.Arena(2 * g["slot_bytes"])
    keys = k.make_keys([1, 2], 0)
    with pytest.raises((TypeError, ValueError)):
        ft.write(keys, np.array([src.base, src.base], dtype=np.float64))
    with pytest.raises(ValueError):
        ft.write(keys, np.array([[src.base, src.base]], dtype=np.uintp))  # 2-D
    with pytest.raises((TypeError, ValueError)):
        ft.write(keys, [src.base, "x"])
    with pytest.raises(ValueError):
        ft.read(keys, [src.base, src.base], user_data=[1])  # user data of another length
    # the right shapes still work
    assert list(ft.write(keys[:1], [src.base])) == [0]
    assert ft.flush(10000) == 0
    ft.close()
    src.close()


def test_remote_tier_short_address_list_raises():
    redis_url()
    run_isolated("""
        import os
        p = small_plan()
        g = p.groups[0]
        try:
            rt = k.RemoteTier("redis://" + os.environ["KVO_TEST_REDIS"], p, key_prefix="pysec%d" % os.getpid())
        except k.KvoError as e:
            assert e.code == L.KVO_ENOTSUP
        else:
            src = k.Arena(4 * g["slot_bytes"])
            keys = k.make_keys([1, 2, 3], 0)
            for call in (rt.put, rt.get):
                try:
                    call(keys, [src.base])
                except ValueError as e:
                    assert "3" in str(e) and "1" in str(e), e
                else:
                    raise AssertionError("no ValueError")
            try:
                rt.exists(keys, user_data=[1, 2])
            except ValueError as e:
                assert "3" in str(e) and "2" in str(e), e
            else:
                raise AssertionError("no ValueError for short user_data")
            rt.close()
    """)


# --------------------------------------------------- item 4: secrets --

def test_redact_url():
    assert core.redact_url("redis://:Secret@99@h:7000") == "redis://:***@h:7000"
    assert core.redact_url("redis://alice:p:w@d@h1:1,h2:2") == "redis://alice:***@h1:1,h2:2"
    assert core.redact_url("redis://h:7000") == "redis://h:7000"
    # userinfo without ':' is a password (the C parser's rule: AUTH <password>)
    assert core.redact_url("redis://Secret@h:7000") == "redis://***@h:7000"
    assert core.redact_url("redis://alice:@h:7000") == "redis://alice:@h:7000"  # empty: nothing to hide
    assert core.redact_url("not a url Secret") == "<unparsable url>"
    assert core.url_has_password("redis://:x@h:1") and core.url_has_password("redis://x@h:1")
    assert not core.url_has_password("redis://h:1") and not core.url_has_password("redis://alice:@h:1")
    # "user:PASSWORD" without "@host:port": not seeds, so never shown
    for url in ("redis://user:Zq9PwLeak", "redis://h:1,user:Zq9PwLeak", "redis://Zq9PwLeak"):
        assert core.url_has_password(url), url
        assert "Zq9PwLeak" not in core.redact_url(url), url
    assert not core.url_has_password("redis://10.0.0.5:7000,10.0.0.6:7000/")


def test_remote_tier_failure_keeps_and_shows_no_password():
    p = small_plan()
    secret = "Pw@Secret-4711"
    for kw in (dict(url="redis://:%s@127.0.0.1:1" % secret), dict(url="redis://127.0.0.1:1", password=secret)):
        try:
            k.RemoteTier(kw.pop("url"), p, io_timeout_ms=200, **kw)
        except k.KvoError as e:
            if e.code == L.KVO_ENOTSUP:
                pytest.skip("library built without hiredis")
            assert "Secret" not in str(e) and "Secret" not in repr(e), repr(e)
            # the half-built object (reachable from the traceback) holds no copy
            tb = e.__traceback__
            while tb is not None:
                obj = tb.tb_frame.f_locals.get("self")
                if isinstance(obj, k.RemoteTier):
                    blob = repr(vars(obj)).encode()
                    assert b"Secret" not in blob, vars(obj)
                tb = tb.tb_next
        else:
            pytest.fail("a tier on port 1 was created")


# ------------------------------------------- item 6: closed handles --

def test_arena_view_after_close_raises():
    run_isolated("""
        a = k.Arena(1 << 16)
        a.close()
        try:
            a.view()
        except (k.KvoError, ValueError) as e:
            assert "closed" in str(e), e
        else:
            raise AssertionError("view() of a closed arena")
    """)


def test_arena_view_outlives_close():
    run_isolated("""
        a = k.Arena(1 << 16)
        v = a.view(4096, 4096)
        a.close()
        v[:] = 7          # the mapping lives while a view does
        assert int(v.sum()) == 7 * 4096
        w = v[10:20]
        del v
        assert int(w.sum()) == 70
        del w
    """)


def test_store_close_during_calls_in_other_threads():
    run_isolated("""
        for round_ in range(5):
            p = small_plan()
            s = k.Store(p, 1 << 20)
            keys = k.make_keys(list(range(256)), 0)
            errors, started = [], threading.Barrier(4)
            def worker():
                started.wait()
                try:
                    while True:
                        s.lookup(keys)
                        s.stats()
                except k.KvoError as e:
                    errors.append(e.code)
            ts = [threading.Thread(target=worker) for _ in range(3)]
            for t in ts: t.start()
            started.wait()
            time.sleep(0.05)
            s.close()
            for t in ts: t.join(30)
            assert not any(t.is_alive() for t in ts), "a caller hung after close()"
            assert errors == [L.KVO_ECLOSED] * 3, errors
            try:
                s.lookup(keys)
            except k.KvoError as e:
                assert e.code == L.KVO_ECLOSED and "closed" in str(e), e
            else:
                raise AssertionError("a call after close()")
            s.close()  # twice is fine
    """)


def test_connector_close_during_lookups_in_three_threads():
    run_isolated("""
        for round_ in range(3):
            p = small_plan()
            g = p.groups[0]
            c = k.Connector(p, 16 * g["slot_bytes"])
            for r in range(3):
                c.add_request(r + 1, list(range(r * 1000, r * 1000 + 96)))
            errors, started = [], threading.Barrier(4)
            def worker(r):
                started.wait()
                try:
                    while True:
                        c.lookup(r)
                except k.KvoError as e:
                    errors.append(e.code)
            ts = [threading.Thread(target=worker, args=(r + 1,)) for r in range(3)]
            for t in ts: t.start()
            started.wait()
            time.sleep(0.05)
            c.close()
            for t in ts: t.join(30)
            assert not any(t.is_alive() for t in ts), "a lookup hung after close()"
            assert errors == [L.KVO_ECLOSED] * 3, errors
    """, timeout=180)


# ------------------------------------------- item 8: ints at the boundary --

def _raises_naming(exc, name, fn, *a, **kw):
    with pytest.raises(exc) as ei:
        fn(*a, **kw)
    assert name in str(ei.value), str(ei.value)


def test_out_of_range_ints_are_refused(tmp_path):
    m = k.Model("sec8", 16, [dict(name="full", tokens_per_block=16, layers=2, page_bytes=1024)])
    _raises_naming(OverflowError, "block_size", k.Plan, m, block_size=2 ** 70)
    _raises_naming(OverflowError, "blocks_per_chunk", k.Plan, m, blocks_per_chunk=2 ** 64)
    _raises_naming(ValueError, "blocks_per_chunk", k.Plan, m, blocks_per_chunk=-1)
    _raises_naming(TypeError, "block_size", k.Plan, m, block_size=1.5)
    p = small_plan()
    _raises_naming(ValueError, "quota_bytes", k.FileTier, str(tmp_path), p, -1)
    _raises_naming(OverflowError, "ttl_s", k.RemoteTier, "redis://127.0.0.1:1", p, ttl_s=2 ** 32 + 5)
    _raises_naming(OverflowError, "expected", k.SharedArena, "sec8", 1 << 16, p.fingerprint, expected=2 ** 32,
                   directory=str(tmp_path))
    _raises_naming(ValueError, "tokens_per_hash", k.Model, "neg", -16)
    _raises_naming(ValueError, "capacity_bytes", k.Store, p, -5)
    _raises_naming(OverflowError, "nbytes", k.Arena, 2 ** 64)


def test_wrong_types_and_none_are_refused():
    p = small_plan()
    _raises_naming(TypeError, "model", k.Plan, None)
    _raises_naming(TypeError, "plan", k.Store, None, 1 << 20)
    _raises_naming(TypeError, "preset_or_path", k.Model.open, None)
    with pytest.raises(TypeError):
        k.make_keys([1.5], 0)
    with pytest.raises(TypeError):
        k.make_keys([1, "2"], 0)
    with pytest.raises((ValueError, OverflowError)):
        k.make_keys([-1], 0)
    with pytest.raises((ValueError, OverflowError)):
        k.make_keys([2 ** 128], 0)
    s = k.Store(p, 1 << 20)
    keys2d = k.make_keys([1, 2, 3, 4], 0).reshape(2, 2)
    with pytest.raises(ValueError) as ei:
        s.lookup(keys2d)
    assert "1-D" in str(ei.value) or "dimension" in str(ei.value)
    s.close()


def test_password_in_url_warned_once_without_the_secret(caplog):
    core._password_warned.discard("test_url")
    with caplog.at_level(logging.WARNING, logger="kvoffload"):
        assert core.warn_if_url_has_password("redis://u:Top@Secret1@h:7000", "test_url")
        assert not core.warn_if_url_has_password("redis://u:Top@Secret1@h:7000", "test_url")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "KVO_REDIS_PASSWORD" in text and "Top@Secret1" not in text and "Secret1" not in text
    assert len(caplog.records) == 1
    assert not core.warn_if_url_has_password("redis://h:7000", "test_url_plain")
