"""Untrusted path checkpoints: hostile saved state, names leaving the folder, killed writers
and two writers at once.

Resumes run in a child process with a timeout wherever a regression could hang or crash;
every test states its pass criterion.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import dl1
from dl1.errors import CheckpointCorruptError, CheckpointLockedError
from dl1.paths.checkpoint_format import LOCK, PROGRESS
from dl1.store.arrays import read_array
from tests.helpers import PathStopped, stop_path_after
from tests.reliability.faults import assert_same_path
from tests.reliability.untrusted import (
    ROOT,
    child_env,
    make_store,
    results,
    rewrite_array,
    run_child,
)

N_ALPHAS = 8
STOP_AT = 3  # the partial checkpoint holds alphas 0..STOP_AT


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A store, the uninterrupted checkpointed path, and a checkpoint stopped after alpha 3."""
    base = tmp_path_factory.mktemp("ck")
    store = make_store(base / "s")
    ref = dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(base / "ref"))
    stop_path_after(STOP_AT, str(store), n_alphas=N_ALPHAS, checkpoint=str(base / "partial"))
    return store, ref, base / "partial"


def _progress(ck):
    return json.loads((ck / PROGRESS).read_text())


def _put_progress(ck, prog):
    (ck / PROGRESS).write_text(json.dumps(prog))


def _edit_state(name, fn):
    """Rewrite state array ``name`` of the last alpha with ``fn(a)``, checksums recomputed."""

    def edit(ck):
        prog = _progress(ck)
        e = prog["done"][-1]
        k = e["k"]
        a = read_array(ck, f"state/{k}/{name}", e["state"][name])
        e["state"][name] = rewrite_array(ck, f"state/{k}/{name}", fn(a))
        _put_progress(ck, prog)

    return edit


def _nan_at_0(a):
    a = a.copy()
    a[0] = np.nan
    return a


def _add_state(name, a):
    def edit(ck):
        prog = _progress(ck)
        e = prog["done"][-1]
        e["state"][name] = rewrite_array(ck, f"state/{e['k']}/{name}", a)
        _put_progress(ck, prog)

    return edit


def _traversal_state(ck):
    prog = _progress(ck)
    e = prog["done"][-1]
    e["state"]["../../../../outside"] = e["state"]["z"]
    _put_progress(ck, prog)


def _progress_field(fn):
    def edit(ck):
        prog = _progress(ck)
        fn(prog["done"])
        _put_progress(ck, prog)

    return edit


def _coef_out_of_range(ck):
    prog = _progress(ck)
    e = prog["done"][1]
    e["indices"] = rewrite_array(ck, "coef/1/indices", np.array([10**6], dtype=np.int64))
    e["values"] = rewrite_array(ck, "coef/1/values", np.array([1.0]))
    _put_progress(ck, prog)


# case: (edit, error message pattern or None for "resumes to the reference path")
HOSTILE = {
    "untouched": (lambda ck: None, None),
    "w holds NaN": (_edit_state("w", _nan_at_0), r"array 'w' holds nan at position 0"),
    "z holds inf": (_edit_state("z", lambda a: np.full_like(a, np.inf)), r"array 'z' holds inf"),
    "z cut to one value": (_edit_state("z", lambda a: a[:1]), r"'z' has 1 values, .* needs 80"),
    "w too long": (_edit_state("w", lambda a: np.zeros(10**5)), r"'w' has 100000 values"),
    "w as int64": (_edit_state("w", lambda a: a.astype(np.int64)), r"state\.w\.dtype"),
    "unknown array": (_add_state("evil", np.zeros(5)), r"array 'evil' is not one this solver"),
    "traversal name": (_traversal_state, r"done\[3\]\.state key is not a plain name"),
    "state deleted": (lambda ck: shutil.rmtree(ck / "state" / "3"), r"state of alpha 3 is missing"),
    "intercept NaN": (_progress_field(lambda d: d[-1].__setitem__("intercept", "nan")),
                      r"the intercept is nan"),
    "k renumbered": (_progress_field(lambda d: d[2].__setitem__("k", 5)), r"done\[2\]\.k is not 2"),
    "gap not hex": (_progress_field(lambda d: d[1].__setitem__("gap", [1])), r"done\[1\]\.gap"),
    "entry deleted field": (_progress_field(lambda d: d[0].pop("values")),
                            r"done\[0\]\.values is missing"),
    "coef index out of range": (_coef_out_of_range, r"alpha 1 has inconsistent arrays"),
}  # fmt: skip

RESUME_CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    import dl1
    from dl1.errors import Dl1Error

    warnings.simplefilter("ignore")
    store, ref_ck, n_alphas = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ref = dl1.path(store, n_alphas=n_alphas, checkpoint=ref_ck)  # reload: no solving
    for case, ck in json.loads(sys.argv[4]).items():
        print(json.dumps({"start": case}), flush=True)
        try:
            r = dl1.path(store, n_alphas=n_alphas, checkpoint=ck)
        except Exception as e:
            out = {"error": type(e).__name__, "dl1": isinstance(e, Dl1Error), "msg": str(e)}
        else:
            same = (r.coefs_ != ref.coefs_).nnz == 0 and np.array_equal(
                r.intercepts_, ref.intercepts_)
            out = {"error": None, "same": bool(same)}
        print(json.dumps({"case": case, **out}), flush=True)
    """
)


@pytest.mark.slow
def test_hostile_saved_state_is_refused_before_the_solver_sees_it(setup, tmp_path):
    """Pass: resuming (in a child, with a timeout) from a checkpoint whose saved state holds
    NaN/inf, has the wrong length or dtype, an unknown or traversal name, is missing, or
    whose progress file has a non-finite intercept or malformed fields, raises a
    CheckpointCorruptError naming the array or field and the problem; the untouched copy
    resumes to the uninterrupted path. Before: NaN in w hung (timeout), z cut to one value
    crashed the interpreter (SIGBUS / SIGABRT), w too long raised a raw ValueError after
    solving, malformed fields raised KeyError/ValueError."""
    store, _, partial = setup
    cases = {}
    for name, (edit, _) in HOSTILE.items():
        ck = tmp_path / name.replace(" ", "_")
        shutil.copytree(partial, ck)
        edit(ck)
        cases[name] = str(ck)
    args = (str(store), str(partial.parent / "ref"), str(N_ALPHAS), json.dumps(cases))
    proc = run_child(RESUME_CHILD, timeout=240, args=args)
    got = {r["case"]: r for r in results(proc) if "case" in r}
    assert set(got) == set(HOSTILE)
    for name, (_, pattern) in HOSTILE.items():
        r = got[name]
        if pattern is None:
            assert r["error"] is None and r["same"], r
        else:
            assert r["error"] == "CheckpointCorruptError", r
            assert re.search(pattern, r["msg"]), (pattern, r["msg"])


def test_symlinked_coef_folder_is_refused_and_nothing_outside_is_deleted(setup, tmp_path):
    """Pass: a checkpoint whose ``coef`` folder is a symlink to a user's folder (holding
    copies of the completed alphas and the user's own files) is refused with a
    CheckpointCorruptError naming the array that resolves outside, and the user's files
    are all still there. Before: the arrays were read through the link and the user's
    non-alpha folders deleted as leftovers."""
    store, _, partial = setup
    ck = tmp_path / "ck"
    shutil.copytree(partial, ck)
    user = tmp_path / "user"
    shutil.move(ck / "coef", user)
    (user / "precious").mkdir()
    (user / "precious" / "notes.txt").write_text("keep me")
    (user / "99").mkdir()  # looks like a leftover alpha
    os.symlink(user, ck / "coef")
    with pytest.raises(CheckpointCorruptError, match=r"coef/0/indices' resolves to .*outside"):
        dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(ck))
    assert (user / "precious" / "notes.txt").read_text() == "keep me"
    assert (user / "99").is_dir() and (user / "0").is_dir()


HOLDER_CHILD = textwrap.dedent(
    """
    import sys, time, warnings
    import dl1

    warnings.simplefilter("ignore")

    def hold(k, alpha, res):
        if k == 1:
            print("holding", flush=True)
            time.sleep(120)

    dl1.path(sys.argv[1], n_alphas=int(sys.argv[3]), checkpoint=sys.argv[2], callback=hold)
    """
)


def _start_holder(store, ck):
    """A child writing ``ck`` that stops after alpha 1 while holding the lock."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER_CHILD, str(store), str(ck), str(N_ALPHAS)],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
    )  # fmt: skip
    watchdog = threading.Timer(120, proc.kill)  # a stuck child fails the test, never hangs it
    watchdog.start()
    line = proc.stdout.readline().strip()
    watchdog.cancel()
    assert line == "holding", (line, proc.poll())
    return proc


@pytest.mark.slow
def test_second_writer_is_refused_and_a_dead_writers_lock_does_not_block(setup, tmp_path):
    """Pass: while a child process writes a checkpoint, dl1.path on the same checkpoint in
    this process raises CheckpointLockedError naming the checkpoint and the child's pid, and
    leaves the checkpoint as the child wrote it; once the child is SIGKILLed, the path
    resumes here to the uninterrupted path, bit for bit. Before: the second writer was
    accepted and both wrote the same progress file."""
    store, ref, _ = setup
    ck = tmp_path / "ck"
    proc = _start_holder(store, ck)
    try:
        before = (ck / PROGRESS).read_bytes()
        with pytest.raises(CheckpointLockedError, match=rf"{ck}.*pid {proc.pid}"):
            dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(ck))
        assert (ck / PROGRESS).read_bytes() == before
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(_progress(ck)["done"]) == 2
    assert_same_path(dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(ck)), ref)


KILL_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time, warnings
    import dl1
    import dl1.paths.checkpoint as ckmod

    warnings.simplefilter("ignore")
    store, ck, n_alphas, point, kill_at = sys.argv[1:6]
    n_alphas, kill_at = int(n_alphas), int(kill_at)
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    real_array, real_manifest = ckmod.write_array, ckmod.write_manifest

    def write_array(root, key, a, **kw):
        # key: coef/{k}/indices, coef/{k}/values, state/{k}/{name}
        part, k, name = key.split("/")
        entry = real_array(root, key, a, **kw)
        if int(k) == kill_at and f"{part}/{name}" == point:
            die()  # this array is complete, the next one and the progress file are not
        return entry

    def write_manifest(root, manifest, name):
        done = manifest.get("done") if isinstance(manifest, dict) else None
        if point == "progress.tmp" and done is not None and len(done) == kill_at + 1:
            with open(os.path.join(root, name + ".tmp"), "w") as fh:
                fh.write(__import__("json").dumps(manifest))
            die()  # the new progress file written, not yet renamed into place
        return real_manifest(root, manifest, name)

    def slow(k, alpha, res):
        print(k, flush=True)
        if point == "random":
            time.sleep(0.1)

    ckmod.write_array, ckmod.write_manifest = write_array, write_manifest
    dl1.path(store, n_alphas=n_alphas, checkpoint=ck, callback=slow)
    """
)


def _kill_at_random(store, ck, seed: int) -> subprocess.Popen:
    """SIGKILL a child running the path at a seeded random moment after alpha 2 is done:
    anywhere in the next alphas' solves or writes (the child spends at least 0.1 s per
    alpha, so 5 alphas remain for a delay of at most 0.45 s)."""
    cmd = [sys.executable, "-c", KILL_CHILD, str(store), str(ck), str(N_ALPHAS), "random", "0"]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=ROOT)  # fmt: skip
    watchdog = threading.Timer(120, proc.kill)  # a stuck child fails the test, never hangs it
    watchdog.start()
    while proc.stdout.readline().strip() not in ("2", ""):
        pass
    threading.Event().wait(np.random.default_rng(seed).uniform(0.0, 0.45))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    watchdog.cancel()
    proc.stdout.close()
    return proc


@pytest.mark.parametrize(
    ("point", "kill_at"),
    [("coef/indices", 3), ("state/w", 4), ("progress.tmp", 2), ("random", 24)],
)
@pytest.mark.slow
def test_writer_killed_mid_write_resumes_to_the_uninterrupted_path(setup, tmp_path, point, kill_at):
    """Pass: a child running dl1.path with a checkpoint is SIGKILLed while writing alpha
    ``kill_at`` (after its coefficient indices, after its state's w, with the new progress
    file written but not renamed), or from outside at a seeded random moment (seed
    ``kill_at``); the checkpoint then holds exactly the alphas completed before the kill
    (the last complete alpha) and resuming gives the uninterrupted path bit for bit."""
    store, ref, _ = setup
    ck = tmp_path / "ck"
    if point == "random":
        proc = _kill_at_random(store, ck, kill_at)
    else:
        cmd = [sys.executable, "-c", KILL_CHILD, str(store), str(ck), str(N_ALPHAS), point,
               str(kill_at)]  # fmt: skip
        proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True,
                              timeout=180, cwd=ROOT)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL
    done = len(_progress(ck)["done"])
    if point == "random":
        assert 3 <= done < N_ALPHAS
    else:
        assert done == kill_at
    assert_same_path(dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(ck)), ref)


@pytest.mark.heavy
def test_many_random_kills_each_resume_to_the_uninterrupted_path(setup, tmp_path):
    """Pass (DL1_HEAVY=1): 12 children killed at seeded random moments, each resumed from
    the checkpoint it left (holding 3 to 7 of the 8 alphas) to the uninterrupted path bit
    for bit."""
    store, ref, _ = setup
    for seed in range(12):
        ck = tmp_path / f"ck{seed}"
        assert _kill_at_random(store, ck, seed).returncode == -signal.SIGKILL
        assert 3 <= len(_progress(ck)["done"]) < N_ALPHAS
        assert_same_path(dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(ck)), ref)


def _lock_is_free(ck) -> bool:
    """Whether nobody holds the checkpoint's lock (a new open file description of the lock
    file conflicts with any holder, in this process too)."""
    import fcntl

    with open(ck / LOCK) as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return True


@pytest.mark.skipif(sys.platform == "win32", reason="no fcntl lock on Windows")
def test_lock_is_released_on_return_and_taken_over_by_a_retry(setup, tmp_path):
    """Pass: dl1.path holds the lock while it runs and releases it when it returns; after a
    path interrupted by an exception (whose traceback still holds the old checkpoint object)
    a retry in the same process resumes instead of being refused, to the uninterrupted path
    bit for bit, and leaves the lock free."""
    store, ref, _ = setup
    ck = tmp_path / "ck"
    seen = []

    def probe(k, alpha, res):
        seen.append(_lock_is_free(ck))
        if k == 2:
            raise PathStopped

    with pytest.raises(PathStopped) as info:
        dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(ck), callback=probe)
    assert seen == [False, False, False]
    assert info.traceback  # the frames holding the interrupted run's checkpoint are alive
    assert_same_path(dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(ck)), ref)
    assert _lock_is_free(ck)
