"""The model pool (specli.serve.pool): loads on demand, one load per model, keep_alive,
--max-loaded, a memory budget with shared parts counted once, faults that leave nothing held."""

import threading
import time

import pytest

from specli.errors import SpecliError
from specli.serve.pool import Cancelled, DoesNotFit, Pool, Want, keep_alive_seconds


class Loader:
    """Records every load and unload; a load can be held until ``gate`` is set, or fail."""

    def __init__(self):
        self.events: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail: set[str] = set()
        self.lock = threading.Lock()

    def load(self, want: Want):
        self.gate.wait(10)
        with self.lock:
            self.events.append(f"load {want.key}")
        if want.key in self.fail:
            raise SpecliError(f"{want.key}: not a GGUF file")
        return f"model:{want.key}"

    def unload(self, value) -> None:
        with self.lock:
            self.events.append(f"unload {value.split(':', 1)[1]}")


def until(cond, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def pool(ld: Loader, **kw) -> Pool:
    return Pool(ld.load, ld.unload, poll=0.01, **kw)


def keys(p: Pool) -> set[str]:
    return {r.want.key for r in p.residents()}


@pytest.mark.parametrize("value, seconds", [
    (300, 300.0), (2.5, 2.5), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("0", 0.0), (0, 0.0),
    (-1, None), ("-1m", None), ("-1s", None),
])
def test_keep_alive_as_ollama_reads_it(value, seconds):
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["300", "5 minutes", "", "m", True, None, [1]])
def test_keep_alive_refuses_what_ollama_refuses(value):
    with pytest.raises(SpecliError, match="keep_alive"):
        keep_alive_seconds(value)


def test_loaded_once_then_reused():
    ld = Loader()
    p = pool(ld)
    with p.lease(Want("a")) as first:
        assert first.value == "model:a"
    with p.lease(Want("a")) as again:
        assert again.value == "model:a" and again.load_duration == 0.0
    assert ld.events == ["load a"]
    p.close()
    assert ld.events == ["load a", "unload a"]


def test_requests_during_a_load_share_it():
    ld = Loader()
    ld.gate.clear()
    p = pool(ld)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(p.acquire(Want("a")))) for _ in range(3)]
    for t in threads:
        t.start()
    assert until(lambda: p.get("a") is not None and p.get("a").refs == 3)
    assert ld.events == []  # still loading
    ld.gate.set()
    for t in threads:
        t.join(10)
    assert ld.events == ["load a"]
    assert [g.value for g in got] == ["model:a"] * 3
    assert all(g.load_duration > 0 for g in got)  # each waited for the one load
    for g in got:
        p.release(g)
    p.close()


def test_keep_alive_zero_unloads_after_the_answer():
    ld = Loader()
    p = pool(ld)
    with p.lease(Want("a"), keep_alive=0.0):
        assert keys(p) == {"a"}
    assert until(lambda: "unload a" in ld.events)
    assert keys(p) == set()


def test_idle_model_unloads_when_its_keep_alive_runs_out_and_not_before():
    ld = Loader()
    p = pool(ld)
    with p.lease(Want("short"), keep_alive=0.2):
        pass
    with p.lease(Want("long"), keep_alive=3600):
        pass
    with p.lease(Want("pinned"), keep_alive=None):
        pass
    assert until(lambda: "unload short" in ld.events)
    assert keys(p) == {"long", "pinned"}
    expiry = {r.want.key: r.expires for r in p.residents()}
    assert expiry["pinned"] is None and expiry["long"] > time.monotonic() + 3000
    p.close()


def test_a_new_request_stops_the_idle_timer():
    ld = Loader()
    p = pool(ld)
    with p.lease(Want("a"), keep_alive=0.3):
        pass
    lease = p.acquire(Want("a"), keep_alive=0.3)
    time.sleep(0.6)
    assert "unload a" not in ld.events  # in use: never unloaded
    p.release(lease)
    assert until(lambda: "unload a" in ld.events)


def test_expire_unloads_an_idle_model_at_once():
    ld = Loader()
    p = pool(ld)
    with p.lease(Want("a"), keep_alive=None):
        pass
    assert p.expire("a")
    assert until(lambda: "unload a" in ld.events)
    assert not p.expire("a")  # not loaded any more


def test_max_loaded_swaps_the_least_recently_used_idle_model():
    ld = Loader()
    p = pool(ld, max_loaded=2, host=25)  # memory for two of them, not three
    for k in ("a", "b", "a"):
        with p.lease(Want(k, {k: 10})):
            pass
    with p.lease(Want("c", {"c": 10})):
        pass
    assert keys(p) == {"a", "c"}
    assert ld.events == ["load a", "load b", "unload b", "load c"]  # freed before the next load
    p.close()


def test_a_model_swapped_out_only_for_max_loaded_is_freed_beside_the_next_load():
    """With memory for both, the unload (freeing a model takes a while) does not delay the load."""
    ld = Loader()
    loading = threading.Event()

    def load(want):
        loading.set()
        return ld.load(want)

    def unload(value):
        ld.events.append("unload starts")
        assert loading.wait(10), "the unload ran before the load"
        ld.unload(value)

    p = Pool(load, unload, poll=0.01, max_loaded=1, host=100)
    with p.lease(Want("a", {"a": 10})):
        pass
    loading.clear()
    with p.lease(Want("b", {"b": 10})):
        pass
    assert until(lambda: len(ld.events) == 4)
    assert keys(p) == {"b"} and ld.events[0] == "load a" and set(ld.events[1:]) == {"unload starts", "load b",
                                                                                    "unload a"}
    p.close()


def test_a_model_kept_for_good_is_evicted_last():
    ld = Loader()
    p = pool(ld, max_loaded=2)
    with p.lease(Want("pinned"), keep_alive=None):
        pass
    with p.lease(Want("b")):
        pass
    with p.lease(Want("c")):
        pass
    assert keys(p) == {"pinned", "c"}
    p.close()


def test_a_busy_model_is_never_evicted_the_next_one_waits():
    ld = Loader()
    p = pool(ld, max_loaded=1)
    busy = p.acquire(Want("a"))
    got = []
    t = threading.Thread(target=lambda: got.append(p.acquire(Want("b"))))
    t.start()
    time.sleep(0.2)
    assert ld.events == ["load a"] and not got
    p.release(busy)
    t.join(10)
    assert until(lambda: len(ld.events) == 3)
    assert ld.events[0] == "load a" and set(ld.events[1:]) == {"unload a", "load b"}
    p.release(got[0])
    p.close()


def test_memory_budget_counts_a_shared_draft_once():
    ld = Loader()
    p = pool(ld, host=100)
    with p.lease(Want("t1", {"t1.gguf": 40, "draft.gguf": 30})):
        pass
    with p.lease(Want("t2", {"t2.gguf": 30, "draft.gguf": 30})):
        pass
    assert keys(p) == {"t1", "t2"}  # 40 + 30 + 30: fits, the draft counted once
    with p.lease(Want("t3", {"t3.gguf": 35})):
        pass
    assert keys(p) == {"t2", "t3"}  # t1, the least recently used, made room
    p.close()


def test_gpu_budget_apart_from_host():
    ld = Loader()
    p = pool(ld, gpu=10)
    with p.lease(Want("a", {"a": 1000}, {"a": 8})):
        pass
    with p.lease(Want("b", {"b": 1000}, {"b": 8})):
        pass
    assert keys(p) == {"b"}
    p.close()


def test_a_model_that_cannot_fit_alone_is_refused_and_nothing_unloads():
    ld = Loader()
    p = pool(ld, host=100)
    with p.lease(Want("a", {"a": 60})):
        pass
    with pytest.raises(DoesNotFit, match="big needs .* GiB of memory, more than"):
        p.acquire(Want("big", {"big": 101}))
    assert keys(p) == {"a"} and ld.events == ["load a"]
    p.close()


def test_a_failed_load_leaves_nothing_held_and_is_tried_again():
    ld = Loader()
    ld.fail.add("bad")
    p = pool(ld, max_loaded=1)
    with p.lease(Want("a")):
        pass
    with pytest.raises(SpecliError, match="not a GGUF"):
        p.acquire(Want("bad"))
    assert keys(p) == set()
    with pytest.raises(SpecliError, match="not a GGUF"):
        p.acquire(Want("bad"))
    assert ld.events.count("load bad") == 2
    with p.lease(Want("a")) as ok:
        assert ok.value == "model:a"


def test_a_client_that_leaves_during_the_load_cancels_only_its_request():
    ld = Loader()
    ld.gate.clear()
    p = pool(ld)
    gone = threading.Event()
    errors, got = [], []

    def leaving():
        try:
            p.acquire(Want("a"), cancelled=gone.is_set)
        except Cancelled as e:
            errors.append(e)

    first = threading.Thread(target=lambda: got.append(p.acquire(Want("a"))))
    first.start()
    assert until(lambda: p.get("a") is not None)
    second = threading.Thread(target=leaving)
    second.start()
    assert until(lambda: p.get("a").refs == 2)
    gone.set()
    second.join(10)
    assert errors and p.get("a").refs == 1
    ld.gate.set()
    first.join(10)
    assert got[0].value == "model:a"
    p.release(got[0])
    p.close()
