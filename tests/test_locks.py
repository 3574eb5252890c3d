"""One writer per output directory: `teller tokenize`, `teller dataset generate` and `collect-cpu`,
`teller train` and `calibrate` take an flock on DIR/.teller.lock (teller._io.dir_lock), so a second
process writing the same directory is refused at once with a DirectoryLockedError naming the first, and
a lock file left by a killed process blocks nothing. write_atomic: a failed write leaves the old file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import teller._io as tio
from teller import tpe
from teller._io import LOCK_FILE, dir_lock
from teller.data import generate, validate
from teller.data.tokenize import tokenize_dataset
from teller.errors import DirectoryLockedError, TellerError, TellerFileNotFoundError, TellerIOError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no flock: dir_lock is a no-op there")

# a child process that takes the lock of argv[1] as command argv[2], says so, and holds it until its
# standard input closes
_HOLD = """
import sys
from teller._io import dir_lock
with dir_lock(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def _held(d: Path, command: str = "teller test-holder") -> Iterator[subprocess.Popen]:
    """Another process holding the lock of ``d`` for the ``with`` block."""
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(d), command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        yield p
    finally:
        if p.poll() is None:
            p.stdin.close()
        p.wait(timeout=10)


def _refused(e: pytest.ExceptionInfo, d: Path, pid: int, command: str) -> None:
    msg = str(e.value)
    assert msg.startswith(
        f"{d}: another teller process is writing it (pid {pid} on {socket.gethostname()}, '{command}', since "
    ), msg
    assert msg.endswith("Z); wait for it to finish or choose another directory"), msg
    assert e.value.path == str(d)


# -- the helper ------------------------------------------------------------------------------------


def test_a_second_process_is_refused_naming_the_holder(tmp_path) -> None:
    d = tmp_path / "out"
    with _held(d, "teller tokenize") as p:
        rec = json.loads((d / LOCK_FILE).read_text())
        assert rec["pid"] == p.pid and rec["command"] == "teller tokenize" and rec["host"]
        with pytest.raises(DirectoryLockedError) as e:
            with dir_lock(d, "teller other"):
                pytest.fail("the lock was taken twice")
        _refused(e, d, p.pid, "teller tokenize")
        # (a TellerError, and an OSError a caller would catch for a busy resource)
        assert isinstance(e.value, TellerIOError) and isinstance(e.value, BlockingIOError)
    # released when its holder is done: taken here, its file gone again afterwards
    with dir_lock(d, "teller other") as got:
        assert got == d and json.loads((d / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert list(d.iterdir()) == []


def test_released_after_the_with_block_even_on_an_error(tmp_path, monkeypatch) -> None:
    d = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyError):
        with dir_lock("out", "teller x", transient=True):
            os.chdir("/")  # (a relative directory, the working directory changed meanwhile)
            raise KeyError("boom")
    assert not d.exists()
    with pytest.raises(KeyError):
        with dir_lock(d, "teller x"):
            raise KeyError("boom")
    assert d.is_dir() and not (d / LOCK_FILE).exists()
    # another process can take it now
    with _held(d) as p:
        assert p.poll() is None
    assert not (d / LOCK_FILE).exists()


def test_a_stale_lock_file_blocks_nothing(tmp_path) -> None:
    d = tmp_path / "out"
    d.mkdir()
    # a lock file a killed process left: a pid that is not running, no flock held
    (d / LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 7, "host": "gone", "command": "teller dead"}))
    with dir_lock(d, "teller new"):
        assert json.loads((d / LOCK_FILE).read_text())["command"] == "teller new"
    # a holder killed outright (SIGKILL: no clean-up): the kernel released its flock
    with _held(d) as p:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    assert (d / LOCK_FILE).exists()  # (left behind)
    with dir_lock(d, "teller new"):
        pass


def test_a_lock_file_removed_by_its_holder_before_this_flock_is_taken_again(tmp_path, monkeypatch) -> None:
    """The holder removes the file on release: a process that opened it before then must not keep a lock
    on a file no longer in the directory (a third process would lock a new one beside it)."""
    d = tmp_path / "out"
    real, calls = tio.fcntl.flock, []

    def flock(fd, op):
        calls.append(op)
        if len(calls) == 1:  # (the holder's release, between this process's open and its flock)
            (d / LOCK_FILE).unlink()
        return real(fd, op)

    monkeypatch.setattr(tio.fcntl, "flock", flock)
    with dir_lock(d, "teller x"):
        assert len(calls) == 2  # (taken on the second try, on the file now there)
        monkeypatch.undo()
        with pytest.raises(DirectoryLockedError):
            with dir_lock(d, "teller y"):
                pass


def test_transient_leaves_no_directory_it_created_for_nothing(tmp_path) -> None:
    new = tmp_path / "a" / "b"
    with dir_lock(new, "teller x", transient=True):
        assert new.is_dir()
    assert not (tmp_path / "a").exists()
    with dir_lock(new, "teller x", transient=True):
        (new / "kept").write_text("x")
    assert (new / "kept").is_file() and not (new / LOCK_FILE).exists()
    old = tmp_path / "old"
    old.mkdir()
    with dir_lock(old, "teller x", transient=True):
        pass
    assert old.is_dir()  # (not created here: kept, empty)


def test_a_directory_that_cannot_be_created_is_named(tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(TellerIOError, match=f"{f / 'sub'}: cannot create the run directory"):
        with dir_lock(f / "sub", "teller x", what="run directory"):
            pass


def test_without_fcntl_a_no_op(tmp_path, monkeypatch) -> None:
    # no lock, but the directory is made as the callers expect (and a transient one removed again)
    monkeypatch.setattr(tio, "fcntl", None)
    with dir_lock(tmp_path / "o", "teller x") as d:
        assert d == tmp_path / "o" and d.is_dir() and not (d / LOCK_FILE).exists()
    assert d.is_dir()
    with dir_lock(tmp_path / "t" / "u", "teller x", transient=True) as d2:
        assert d2.is_dir()
    assert not (tmp_path / "t").exists()
    # dataset generate into a new directory works there too
    generate(tmp_path / "ds", num_samples=2, seed=1, preset="tiny")
    assert (tmp_path / "ds" / "manifest.json").is_file()


def test_a_symlink_at_the_lock_files_name_is_refused(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / LOCK_FILE).symlink_to(victim)
    with pytest.raises(TellerIOError, match="symbolic link"), dir_lock(out, "teller x"):
        pass
    assert victim.read_text() == "keep me"
    (out / LOCK_FILE).unlink()
    (out / LOCK_FILE).mkdir()  # (a directory of that name)
    with pytest.raises(TellerIOError, match="lock file"), dir_lock(out, "teller x"):
        pass


# -- the commands ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("locks")
    generate(root / "ds", num_samples=4, seed=1, preset="tiny")
    tpe.train(root / "ds", vocab_size=300).save(root / "tpe")
    return root


def test_generate_refuses_a_directory_being_written(tmp_path) -> None:
    out = tmp_path / "ds"
    with _held(out, "teller dataset generate") as p:
        with pytest.raises(DirectoryLockedError) as e:
            generate(out, num_samples=2, seed=1, preset="tiny")
        _refused(e, out, p.pid, "teller dataset generate")
        assert [c.name for c in out.iterdir()] == [LOCK_FILE]  # (no stamp, no sample)
    generate(out, num_samples=2, seed=1, preset="tiny")
    assert validate(out) == [] and not any(c.name.startswith(".") for c in out.iterdir())


def test_generate_cli_refusal_is_one_line(tmp_path) -> None:
    out = tmp_path / "ds"
    cli = [sys.executable, "-m", "teller", "dataset", "generate", "--preset", "tiny", "--num-samples", "2"]
    with _held(out, "teller dataset generate") as p:
        r = subprocess.run([*cli, "--output-dir", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: {out}: another teller process is writing it (pid {p.pid} "), r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr


def test_tokenize_refuses_an_output_root_being_written(small, tmp_path) -> None:
    root = tmp_path / "tok"
    with _held(root, "teller tokenize") as p:
        # (any run id: the lock is on the root, where the run id is chosen)
        for kw in ({}, {"run_id": "mine"}):
            with pytest.raises(DirectoryLockedError) as e:
                tokenize_dataset(small / "ds", small / "tpe", root, shard_size=4, **kw)
            _refused(e, root, p.pid, "teller tokenize")
        assert [c.name for c in root.iterdir()] == [LOCK_FILE]
    run = tokenize_dataset(small / "ds", small / "tpe", root, shard_size=4)
    assert sorted(c.name for c in root.iterdir()) == [run.name]


def test_a_stale_lock_file_changes_no_listing(small, tmp_path) -> None:
    """A lock file a killed process left in a dataset, a shards root or a run directory is not taken
    for a sample, a run or a run's file."""
    from teller.models.train import check_new_run_dir, shards_run_dir

    stale = json.dumps({"pid": 2**22 + 7, "host": "gone", "command": "teller dead"})
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / LOCK_FILE).write_text(stale)
    generate(ds, num_samples=2, seed=1, preset="tiny")  # (not "holds sample directories")
    (ds / LOCK_FILE).write_text(stale)
    assert validate(ds, deep=True) == []
    root = tmp_path / "tok"
    run = tokenize_dataset(small / "ds", small / "tpe", root, shard_size=4)
    (root / LOCK_FILE).write_text(stale)
    assert tokenize_dataset(small / "ds", small / "tpe", root, shard_size=4) == run  # (resumed)
    (root / LOCK_FILE).write_text(stale)
    assert shards_run_dir(root) == run
    rd = tmp_path / "rd"
    rd.mkdir()
    (rd / LOCK_FILE).write_text(stale)
    check_new_run_dir(rd)  # (holds no run)


@pytest.mark.parametrize("resume", [False, True])
def test_train_refuses_a_run_directory_being_written(tmp_path, resume) -> None:
    from teller.models.train import train

    out = tmp_path / "run"
    with _held(out, "teller train mot") as p:
        # (refused first: before the shards, here missing, are read)
        with pytest.raises(DirectoryLockedError) as e:
            train({}, tmp_path / "no-shards", out, resume=resume, overrides={"arch": "mot"})
        _refused(e, out, p.pid, "teller train mot")
    # unlocked: on to the shards; the run directory created for the lock is gone again
    with pytest.raises(TellerError, match="no tokenized shards"):
        train({}, tmp_path / "no-shards", tmp_path / "new", resume=resume)
    assert not (tmp_path / "new").exists()


def test_baselines_and_ensemble_refuse_a_run_directory_being_written(tmp_path) -> None:
    from teller.models.baselines import train_baselines
    from teller.models.ensemble import fit_ensemble

    out = tmp_path / "run"
    with _held(out, "teller train mot") as p:
        with pytest.raises(DirectoryLockedError) as e:
            train_baselines(tmp_path / "no-shards", out, log=lambda m: None)
        _refused(e, out, p.pid, "teller train mot")
        with pytest.raises(DirectoryLockedError) as e:
            fit_ensemble(tmp_path / "no-mot", tmp_path / "no-base", out, log=lambda m: None)
        _refused(e, out, p.pid, "teller train mot")
    for fit in (
        lambda o: train_baselines(tmp_path / "no-shards", o, log=lambda m: None),
        lambda o: fit_ensemble(tmp_path / "no-mot", tmp_path / "no-base", o, log=lambda m: None),
    ):
        with pytest.raises(TellerFileNotFoundError, match="no-shards|no-mot"):  # (its inputs, not a lock)
            fit(tmp_path / "new")
        assert not (tmp_path / "new").exists()


def test_calibrate_refuses_a_run_being_trained(tmp_path) -> None:
    from teller.models.train import calibrate

    run = tmp_path / "run"
    run.mkdir()
    with _held(run, "teller train mot") as p:
        # (refused before config.json, here missing, is read: nothing of the run is touched)
        with pytest.raises(DirectoryLockedError) as e:
            calibrate(run)
        _refused(e, run, p.pid, "teller train mot")
    # unlocked: on to the run's files; the lock file is gone again
    with pytest.raises(TellerFileNotFoundError, match="run: not a checkpoint"):
        calibrate(run)
    assert list(run.iterdir()) == []
    # a run directory that does not exist is named, and not created for a lock
    with pytest.raises(TellerFileNotFoundError, match="missing: no such checkpoint"):
        calibrate(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_collect_cpu_refuses_a_directory_being_collected(tmp_path) -> None:
    from teller.data.cpu_runs import collect_cpu

    out = tmp_path / "runs"
    with _held(out, "teller dataset collect-cpu") as p:
        with pytest.raises(DirectoryLockedError) as e:
            collect_cpu(out, 1)
        _refused(e, out, p.pid, "teller dataset collect-cpu")
    assert list(out.iterdir()) == []  # (no run was started)


def test_write_atomic_leaves_the_old_file_on_a_failed_write(tmp_path) -> None:
    f = tmp_path / "eval.json"
    tio.write_atomic(f, '{"old": 1}')
    assert f.read_text() == '{"old": 1}'

    def fails(t: Path) -> None:
        t.write_text('{"ne')  # half of the new file, then the writer dies
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tio.write_atomic(f, fails)
    assert f.read_text() == '{"old": 1}'
    assert sorted(x.name for x in tmp_path.iterdir()) == ["eval.json"]  # (no temporary file left)
    tio.write_atomic(f, b"\x00\x01")
    assert f.read_bytes() == b"\x00\x01"
    # a link is written through, the file keeps its mode, a long name still gets a temporary file
    f.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(f)
    tio.write_atomic(link, "new")
    assert link.is_symlink() and f.read_text() == "new" and (f.stat().st_mode & 0o777) == 0o600
    long = tmp_path / ("eval-" + "x" * 240 + ".json")
    tio.write_atomic(long, "{}")
    assert long.read_text() == "{}" and sorted(x.name for x in tmp_path.iterdir()) == sorted(
        ["eval.json", "link.json", long.name]
    )
    with pytest.raises(TellerIOError, match=r"cannot write it"):
        tio.write_atomic(tmp_path / "no-dir" / "x.json", "{}")


def test_claim_run_dir_takes_a_name_no_one_else_has(tmp_path, monkeypatch) -> None:
    # the window a check-then-create leaves: the name looks free (exists() says no) but another
    # process created it meanwhile; the claim is mkdir's, so it moves on to the next name
    taken = tmp_path / "runs" / "tpe-1"
    taken.mkdir(parents=True)
    (taken / "theirs").write_text("x")
    monkeypatch.setattr(Path, "exists", lambda self: False)
    got = tio.claim_run_dir(tmp_path / "runs", "tpe-1")
    assert got == tmp_path / "runs" / "tpe-1-1" and got.is_dir() and list(got.iterdir()) == []
    assert sorted(x.name for x in taken.iterdir()) == ["theirs"]
    monkeypatch.undo()
    # a parent that cannot be created is named
    (tmp_path / "file").write_text("x")
    with pytest.raises(TellerIOError, match="file"):
        tio.claim_run_dir(tmp_path / "file" / "runs", "tpe-1")


def test_a_run_being_trained_is_not_evaluated(tmp_path) -> None:
    """`teller evaluate` of a run `teller train` is still writing would score some epoch's weights,
    uncalibrated, and write its metrics into the run: refused, naming the holder; a reader's check
    that takes nothing and creates nothing."""
    from teller.models.report import evaluate_any

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert tio.lock_holder(run) is None and not (run / LOCK_FILE).exists()
    with _held(run, "teller train mot"):
        assert "teller train mot" in tio.lock_holder(run)
        with pytest.raises(DirectoryLockedError, match=r"being written \(pid .*'teller train mot'"):
            evaluate_any(run, None, "test")
    assert tio.lock_holder(run) is None
