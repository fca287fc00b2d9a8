"""One real vLLM engine (vllm.LLM on CPU, in this process) over kvoffload,
and the eviction scenario the end-to-end tests and the TTFT benchmark run.

The device KV cache is forced small (num_gpu_blocks_override) so that a
prompt's blocks are pushed out of it by unrelated prompts and must come
back through kvoffload.  Correctness compares like with like: vLLM on CPU
computes in bf16 and its results depend on how a prompt is split into
computed chunks, so a recompute may flip a near-tied greedy token.  Here
the same prompt is answered twice with the same prefix: once while its
blocks are still in the device cache (vLLM's own prefix cache hit: what a
never-evicting device cache gives) and once after they were evicted and
loaded back by kvoffload.  Both compute exactly the same suffix over the
same KV bytes, so the generated tokens and the top-k logprobs must be
bit-identical."""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # scheduler and worker in this process

BLOCK = 32  # vLLM's CPU attention wants multiples of 32


PATHS = ("spec", "native")  # vLLM's OffloadingConnector with kvoffload's spec; kvoffload's KvoffloadConnector


def kv_transfer_config(extra: dict[str, Any], path: str = "spec") -> dict[str, Any]:
    """vLLM's kv_transfer_config for kvoffload by path: "spec" (vLLM's
    OffloadingConnector with KvoffloadOffloadingSpec) or "native"
    (KvoffloadConnector); extra: kv_connector_extra_config (blocks_per_chunk
    1 unless given)."""
    if path == "native":
        ex = {"blocks_per_chunk": 1, **extra}
        return {"kv_connector": "KvoffloadConnector", "kv_connector_module_path": "kvoffload.vllm.connector",
                "kv_role": "kv_both", "kv_connector_extra_config": ex}
    if path != "spec":
        raise ValueError(f"path {path!r}: one of {PATHS}")
    ex = {"spec_name": "KvoffloadOffloadingSpec", "spec_module_path": "kvoffload.vllm", "blocks_per_chunk": 1}
    ex.update(extra)
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": ex}


def make_llm(model_dir: str, extra: Optional[dict[str, Any]], device_blocks: int, max_model_len: int,
             batched_tokens: int = 1024, path: str = "spec", **kw: Any) -> Any:
    """A greedy CPU vLLM with token-id prompts; extra None: no connector;
    path: kv_transfer_config's."""
    from vllm import LLM
    args = dict(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", gpu_memory_utilization=0.25,
                num_gpu_blocks_override=device_blocks, max_model_len=max_model_len,
                max_num_batched_tokens=batched_tokens, max_num_seqs=4, block_size=BLOCK,
                enable_prefix_caching=True, disable_log_stats=False, seed=0, enforce_eager=True)
    if extra is not None:
        args["kv_transfer_config"] = kv_transfer_config(extra, path)
    args.update(kw)
    return LLM(**args)


@dataclass
class Answer:
    tokens: list[int]
    logprobs: list[dict[int, tuple[float, Optional[int]]]]
    cached: int            # num_cached_tokens (device + external hits)
    seconds: float
    first_token_s: Optional[float] = None


def ask(llm: Any, prompt: list[int], max_tokens: int = 8, logprobs: int = 5, salt: Optional[str] = None) -> Answer:
    """A greedy answer; salt: the request's cache_salt (its tenant)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs)
    tp = TokensPrompt(prompt_token_ids=prompt)
    if salt is not None:
        tp["cache_salt"] = salt
    t0 = time.perf_counter()
    out = llm.generate([tp], sp, use_tqdm=False)[0]
    dt = time.perf_counter() - t0
    c = out.outputs[0]
    lps = [{int(t): (float(v.logprob), v.rank) for t, v in d.items()} for d in (c.logprobs or [])]
    ttft = None
    m = getattr(out, "metrics", None)
    if m is not None and getattr(m, "first_token_latency", None):
        ttft = float(m.first_token_latency)
    return Answer(list(c.token_ids), lps, int(out.num_cached_tokens or 0), dt, ttft)


def metrics() -> dict[str, float]:
    """vLLM's Prometheus metrics of this process by name, labels summed
    (counters without their _total; histograms as name_count and name_sum),
    and per transfer_type for the kv_offload ones (name[load]).  Read from
    the registry: LLM.get_metrics() rounds counters to integers, which
    loses the transfer times (seconds)."""
    from prometheus_client import REGISTRY
    out: dict[str, float] = {}
    for m in REGISTRY.collect():
        if not m.name.startswith("vllm:"):
            continue
        for s in m.samples:
            if s.name.endswith("_created") or s.name.endswith("_bucket"):
                continue
            name = s.name[:-6] if s.name.endswith("_total") else s.name
            out[name] = out.get(name, 0.0) + float(s.value)
            tt = s.labels.get("transfer_type")
            if tt:
                k = f"{name}[{tt}]"
                out[k] = out.get(k, 0.0) + float(s.value)
    return out


def kvo_stats() -> dict[str, Any]:
    """kvoffload's spec's managers and workers, and kvoffload's secondary
    tiers under vLLM's tiering spec ("tiers")."""
    from kvoffload.vllm.connector import live_stats as connector_stats
    from kvoffload.vllm.spec import live_stats
    out = live_stats()
    out["connector"] = connector_stats()
    try:
        from kvoffload.vllm.tiering import live_stats as tier_stats
    except ImportError:  # a vLLM without tiering
        return out
    out["tiers"] = tier_stats()
    return out


def tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(n)]


@dataclass
class Result:
    first: Answer = None          # the prompt computed
    device_hit: Answer = None     # asked again, blocks in the device cache
    loaded: Answer = None         # asked again after eviction: loaded through kvoffload
    turn2_device: Answer = None
    turn2_loaded: Answer = None
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    kvo: dict[str, Any] = field(default_factory=dict)


def evict(llm: Any, rng: random.Random, n_prompts: int, length: int, vocab: int) -> None:
    for _ in range(n_prompts):
        ask(llm, tokens(rng, length, vocab), max_tokens=1, logprobs=0)


def corrupt_files(root: str) -> int:
    """Fault injection: flip a byte in the second half of every file under
    root (the file tier's chunks: their payloads fail verification, so a
    read of them is a miss); returns how many files were changed."""
    n = 0
    for d, _, names in os.walk(root):
        for name in names:
            f = os.path.join(d, name)
            size = os.path.getsize(f)
            if size < 2:
                continue
            with open(f, "r+b") as fh:
                fh.seek(size * 3 // 4)
                b = fh.read(1)
                fh.seek(size * 3 // 4)
                fh.write(bytes([b[0] ^ 0xFF]))
            n += 1
    return n


def run(llm: Any, prompt_len: int, fill_len: int, fill_prompts: int, vocab: int, seed: int = 1,
        corrupt: Optional[str] = None) -> Result:
    """The scenario: a prompt P, P again (device hit), unrelated prompts
    that evict P, P again (loaded); then a second turn T = P + answer + new
    tokens the same way (device hit, evicted, loaded).  corrupt: a file
    tier's root whose files are corrupted before P is asked again."""
    rng = random.Random(seed)
    p = tokens(rng, prompt_len, vocab)
    r = Result()
    r.first = ask(llm, p)
    r.device_hit = ask(llm, p)
    r.before = metrics()
    evict(llm, rng, fill_prompts, fill_len, vocab)
    if corrupt:
        r.kvo["corrupted_files"] = corrupt_files(corrupt)
    r.loaded = ask(llm, p)
    t = p + r.loaded.tokens + tokens(rng, 40, vocab)
    ask(llm, t)  # computed once (stores the new blocks)
    r.turn2_device = ask(llm, t)
    evict(llm, rng, fill_prompts, fill_len, vocab)
    r.turn2_loaded = ask(llm, t)
    r.after = metrics()
    r.kvo.update(kvo_stats())
    return r


def run_tenants(llm: Any, prompt_len: int, fill_len: int, fill_prompts: int, vocab: int, seed: int = 1) -> Result:
    """Two tenants: alice asks P (computed, then a device hit); bob's
    unrelated prompts evict it from the device cache and churn the host
    tier; alice asks P again (loaded where her part kept it)."""
    rng = random.Random(seed)
    p = tokens(rng, prompt_len, vocab)
    r = Result()
    r.first = ask(llm, p, salt="alice-secret")
    r.device_hit = ask(llm, p, salt="alice-secret")
    r.before = metrics()
    for _ in range(fill_prompts):
        ask(llm, tokens(rng, fill_len, vocab), max_tokens=1, logprobs=0, salt="bob-secret")
    r.loaded = ask(llm, p, salt="alice-secret")
    r.after = metrics()
    r.kvo.update(kvo_stats())
    return r


def replay_events(endpoint: str, timeout_s: float = 60.0) -> list[Any]:
    """Every KV event batch vLLM's ZMQ publisher still buffers, asked for
    through its replay endpoint (a DEALER socket, from sequence 0) until two
    answers in a row hold the same number of batches (the publisher thread
    has published what the engine handed it)."""
    import msgspec
    import zmq
    from vllm.distributed.kv_events import KVEventBatch
    dec = msgspec.msgpack.Decoder(type=KVEventBatch)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    last: Optional[int] = None
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            sock.send_multipart((b"", (0).to_bytes(8, "big")))
            batches = []
            while sock.poll(int(timeout_s * 1000)):
                _, _topic, seq, payload = sock.recv_multipart()
                if int.from_bytes(seq, "big", signed=True) == -1:
                    break
                batches.append(dec.decode(payload))
            if last is not None and len(batches) == last and batches:
                return [e for b in batches for e in b.events]
            last = len(batches)
            sock.poll(200)  # a short pause between asks (the publisher runs every 0.1 s)
    finally:
        sock.close(linger=0)
    raise TimeoutError("KV event replay did not settle")


def summarize_events(events: list[Any]) -> dict[str, int]:
    """Counts of events by "stored|removed medium ownership locality"."""
    out: dict[str, int] = {}
    for e in events:
        kind = type(e).__name__.replace("Block", "").lower()
        k = f"{kind} {getattr(e, 'medium', None)} {getattr(e, 'ownership', None)} {getattr(e, 'locality', None)}"
        out[k] = out.get(k, 0) + len(getattr(e, "block_hashes", ()) or ())
    return out


def main(argv: list[str]) -> int:
    """python scenario.py MODEL_DIR EXTRA_JSON DEVICE_BLOCKS [VOCAB [PATH
    [OPTIONS_JSON]]]: run the scenario in a fresh engine (PATH: spec or
    native) and print its Result as one JSON line (the last).  OPTIONS:
    {"events_dir": D} publishes vLLM's KV events on ipc sockets in D and
    reports them ("events": counts by kind, medium, ownership, locality);
    {"corrupt": ROOT} corrupts the file tier's files before the reload;
    {"tenants": N} runs run_tenants with N of bob's prompts instead."""
    import dataclasses
    import json
    model_dir, extra, blocks = argv[0], json.loads(argv[1]), int(argv[2])
    vocab = int(argv[3]) if len(argv) > 3 else 512
    path = argv[4] if len(argv) > 4 else "spec"
    opts = json.loads(argv[5]) if len(argv) > 5 else {}
    kw: dict[str, Any] = {}
    if opts.get("events_dir"):
        from vllm.config import KVEventsConfig
        d = opts["events_dir"]
        kw["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                                endpoint=f"ipc://{d}/pub", replay_endpoint=f"ipc://{d}/replay")
    t0 = time.perf_counter()
    llm = make_llm(model_dir, extra, device_blocks=blocks, max_model_len=1280, path=path, **kw)
    startup = time.perf_counter() - t0
    if opts.get("tenants"):
        r = run_tenants(llm, prompt_len=613, fill_len=1000, fill_prompts=int(opts["tenants"]), vocab=vocab)
    else:
        r = run(llm, prompt_len=613, fill_len=1000, fill_prompts=2, vocab=vocab, corrupt=opts.get("corrupt"))
    d = dataclasses.asdict(r)
    if opts.get("events_dir"):
        d["events"] = summarize_events(replay_events(f"ipc://{opts['events_dir']}/replay"))
    d["startup_s"] = startup
    d["total_s"] = time.perf_counter() - t0
    print("KVO-E2E-RESULT " + json.dumps(d), flush=True)
    del llm
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
