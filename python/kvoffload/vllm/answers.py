"""What a Redis Cluster tier answered about keys: the memory of EXISTS
answers that the vLLM manager (manager.py, kvoffload's own spec) and the
Redis secondary tier of vLLM's tiering spec (tiering.py) look up before
asking the cluster again.

Layout: answers, key -> (present, expiry), oldest first and bounded (the
oldest dropped past cap); the questions in flight, user data -> key, and
their keys; the keys this engine put while their question was in flight.
Keys are any hashable value (the manager's 24-byte kvo_chunk_key records,
the tiering tier's (lo, hi) pairs).

An answer is a hint, kept ttl_s: a wrong "present" costs a read that fails
into a miss, a wrong "absent" a miss (the chunk is computed again).  One
question per key is in flight at most.

The invariant: an answer never says "absent" for a key this engine put
after the question was asked.  vLLM looks a request's keys up group by
group and goes on to compute it as soon as one group's key misses, so
another group's question can still be in flight when its key is computed
and put.  Redis read that key before the put and answers "absent"; taken as
it is, that answer made the next lookup of the key, once the host tier had
dropped it, a miss until the answer expired.  Such an answer lands as
"present" here.  A put also turns a remembered "absent" into "present"."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Optional
import time


class RemoteAnswers:
    """The EXISTS answers of one tier (module doc).  Not thread-safe: one
    caller at a time (vLLM's scheduler thread)."""

    def __init__(self, ttl_s: float, cap: int = 1 << 16) -> None:
        self.ttl_s = max(0.0, ttl_s)
        self.cap = cap
        self._a: OrderedDict[Hashable, tuple[bool, float]] = OrderedDict()
        self._asking: dict[int, Hashable] = {}   # user data -> key, EXISTS in flight
        self._asked: set[Hashable] = set()       # ... their keys
        self._put: set[Hashable] = set()         # ... put by this engine since asked

    def get(self, ck: Hashable) -> Optional[bool]:
        """The live answer for ck, or None (none, or expired: dropped)."""
        ans = self._a.get(ck)
        if ans is None:
            return None
        if ans[1] < time.monotonic():
            del self._a[ck]
            return None
        return ans[0]

    def remember(self, ck: Hashable, present: bool) -> None:
        a = self._a
        a[ck] = (present, time.monotonic() + self.ttl_s)
        a.move_to_end(ck)
        while len(a) > self.cap:
            a.popitem(last=False)

    def forget(self, ck: Hashable) -> None:
        self._a.pop(ck, None)

    def asking(self, ck: Hashable) -> bool:
        """A question about ck is in flight."""
        return ck in self._asked

    def sent(self, ud: int, ck: Hashable) -> None:
        """A question about ck went out with user data ud."""
        self._asking[ud] = ck
        self._asked.add(ck)

    def not_sent(self, ck: Hashable) -> None:
        """A question about ck announced with stored(asking=True) was not
        sent after all (the tier refused it)."""
        self._put.discard(ck)

    def landed(self, ud: int, present: bool) -> None:
        """The answer to the question with user data ud (others: ignored)."""
        ck = self._asking.pop(ud, None)
        if ck is None:
            return
        self._asked.discard(ck)
        put = ck in self._put
        if put:
            self._put.discard(ck)
        self.remember(ck, present or put)

    def stored(self, ck: Hashable, asking: bool = False) -> None:
        """This engine's put of ck was accepted (asking: a question about
        ck is about to be sent, e.g. in a batch not yet out)."""
        if ck in self._a:
            self.remember(ck, True)
        if asking or ck in self._asked:
            self._put.add(ck)

    def in_flight(self) -> bool:
        return bool(self._asking)

    def clear(self) -> None:
        """Drop the answers (the questions in flight stay)."""
        self._a.clear()

    def cancel(self) -> None:
        """Drop the questions in flight (their tier is gone)."""
        self._asking.clear()
        self._asked.clear()
        self._put.clear()
