"""Download faults for the Hub source, through the real huggingface-hub client against the local
Hub server: a download killed mid-way, a full disk (before and during a download), two `specli
pull` at once, and a cached file corrupted after the download. Kills and fills are driven by
events (the server holding a download after N bytes, a partial file on disk), never by sleeps."""

import os
import signal
import subprocess

import pytest
from clihelp import specli
from faulthelp import start, tmpfs, wait_for
from hubhelp import cache_file, one_line_error
from hubserver import HubServer, HubState, Repo

REPO = "tiny-org/Tiny-Target-2B-GGUF"
FILE = "tiny-target-2b-q4_k_m.gguf"
REF = f"{REPO}:Q4_K_M"
SMALL_REPO = "tiny-org/Small-1B-GGUF"


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("small") / "small.gguf"
    p.write_bytes(os.urandom(100_000))
    return str(p)


@pytest.fixture()
def hub(tiny_target, small_file):
    with HubServer(HubState(repos={REPO: Repo({FILE: tiny_target}),
                                   SMALL_REPO: Repo({"small-1b-q4_k_m.gguf": small_file})})) as srv:
        yield srv


@pytest.fixture()
def env(hub, tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), SPECLI_CONFIG_DIR=str(tmp_path / "config"),
             SPECLI_CACHE=str(tmp_path / "specli"), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
             # a held download is held, not retried: the client's 10 s read timeout would start the
             # download again without the hold and finish it between two looks at the disk
             HF_HUB_DOWNLOAD_TIMEOUT="600")
    return e


def blobs(env):
    return os.path.join(env["HF_HOME"], "hub", "models--" + REPO.replace("/", "--"), "blobs")


def partial_files(env):
    d = blobs(env)
    return [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".incomplete")] if os.path.isdir(d) else []


def same(path, original):
    return open(path, "rb").read() == open(original, "rb").read()


def test_killed_midway_then_run_again(env, hub, tiny_target):
    # huggingface-hub writes what it receives in chunks of DOWNLOAD_CHUNK_SIZE (10 MiB): hold the
    # download past the first one so that the partial file has bytes in it when the process dies
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE
    hold = DOWNLOAD_CHUNK_SIZE + (1 << 20)
    assert os.path.getsize(tiny_target) > hold
    hub.state.pause_at[FILE] = hold
    p = start("pull", REF, env=env)
    assert hub.state.paused.wait(300), "the download never started"
    wait_for("a partial file on disk", lambda: any(os.path.getsize(f) > 0 for f in partial_files(env)))
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    hub.state.release.set()
    assert partial_files(env) and cache_file(env, REPO, FILE) is None  # only a partial file, not in a snapshot
    rc, out, err = specli("pull", REF, env=dict(env, HF_HUB_OFFLINE="1"))
    assert "is not in the cache" in one_line_error(rc, err)  # the partial file is not taken for the model
    rc, out, err = specli("pull", REF, env=env)
    assert rc == 0, err
    assert same(cache_file(env, REPO, FILE), tiny_target)
    assert partial_files(env) == []  # the killed process's partial file was cleared


def test_two_pulls_at_once_end_with_one_good_file(env, hub, tiny_target):
    size = os.path.getsize(tiny_target)
    hub.state.pause_at[FILE] = size // 3
    a = start("pull", REF, env=env)
    assert hub.state.paused.wait(300)
    wait_for("a's partial file", lambda: partial_files(env))
    b = start("pull", REF, env=env)
    head = f"HEAD /{REPO}/resolve/main/{FILE}"
    wait_for("b asking for the file", lambda: sum(r == head for r in hub.state.requests) >= 2)
    hub.state.release.set()
    (out_a, err_a), (out_b, err_b) = a.communicate(timeout=300), b.communicate(timeout=300)
    assert a.returncode == 0 and b.returncode == 0, err_a + err_b
    got = cache_file(env, REPO, FILE)
    assert out_a.split()[-1] == out_b.split()[-1] == got and same(got, tiny_target)
    assert hub.state.served[FILE] == size  # b waited on a's lock and used a's file
    assert partial_files(env) == []


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupted_cached_file_detected_and_fetched_again(env, hub, tiny_target, damage):
    assert specli("pull", REF, env=env)[0] == 0
    path = cache_file(env, REPO, FILE)
    with open(path, "r+b") as f:
        if damage == "flip":
            f.seek(os.path.getsize(path) - 1000)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x10]))
        else:
            f.truncate(os.path.getsize(path) - 1000)
    rc, out, err = specli("run", "--target", REF, "--draft", "none", "--raw", "-n", "4", "--prompt", "hi", env=env)
    line = one_line_error(rc, err)
    assert line.startswith(f"specli: error: {path} is corrupted (SHA-256 "), line
    assert line.endswith(f"run `specli pull {REF}` to fetch it again"), line
    rc, out, err = specli("pull", REF, env=env)
    assert rc == 0 and f"{path} is corrupted" in err and "downloading it again" in err, err
    assert same(path, tiny_target)
    assert hub.state.served[FILE] == 2 * os.path.getsize(tiny_target)
    rc, out, err = specli("run", "--target", REF, "--draft", "none", "--raw", "-n", "4", "--prompt", "hi", env=env)
    assert rc == 0, err


def test_a_damaged_header_in_the_cache_is_reported_as_corruption(env, hub):
    assert specli("pull", REF, env=env)[0] == 0
    path = cache_file(env, REPO, FILE)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(b"\x63")  # GGUF version 99
    rc, out, err = specli("check", REF, REF, env=env)
    line = one_line_error(rc, err)
    assert line.startswith(f"specli: error: {path} is corrupted (SHA-256 "), line
    assert line.endswith(f"run `specli pull {REF}` to fetch it again"), line


@pytest.fixture()
def small_disk(tmp_path):
    with tmpfs(tmp_path / "small", "4m") as mnt:
        yield mnt


def test_disk_full_before_the_download(env, hub, small_disk, small_file, tiny_target):
    env = dict(env, HF_HOME=str(small_disk))
    rc, out, err = specli("pull", f"{SMALL_REPO}:Q4_K_M", env=env)
    assert rc == 0, err
    small = out.split()[-1]
    rc, out, err = specli("pull", REF, env=env)
    line = one_line_error(rc, err)
    need = os.path.getsize(tiny_target) / 2**20
    assert line.startswith(f"specli: error: not enough space in {small_disk}/hub: {FILE} needs {need:.1f} MiB, "), line
    assert "free disk space" not in err, err  # huggingface-hub's own warning is not shown as well
    assert partial_files(env) == [] and cache_file(env, REPO, FILE) is None
    assert same(small, small_file)  # the rest of the cache is untouched


def test_disk_full_during_the_download(env, hub, small_disk, tiny_target):
    env = dict(env, HF_HOME=str(small_disk))
    subprocess.run(["mount", "-o", "remount,size=40m", str(small_disk)], check=True)
    hub.state.pause_at[FILE] = os.path.getsize(tiny_target) // 3
    p = start("pull", REF, env=env)
    assert hub.state.paused.wait(300)
    wait_for("a partial file", lambda: partial_files(env))
    with open(small_disk / "filler", "wb", buffering=0) as f:  # something else fills the disk meanwhile
        try:
            while f.write(b"\0" * (1 << 20)):
                pass
        except OSError:
            pass
    hub.state.release.set()
    out, err = p.communicate(timeout=300)
    line = one_line_error(p.returncode, err)
    assert line.startswith(f"specli: error: not enough space in {small_disk}/hub: {FILE} needs "), line
    assert partial_files(env) == [] and cache_file(env, REPO, FILE) is None
    os.unlink(small_disk / "filler")
    rc, out, err = specli("pull", REF, env=env)
    assert rc == 0 and same(cache_file(env, REPO, FILE), tiny_target), err
