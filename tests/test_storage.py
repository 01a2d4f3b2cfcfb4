"""Resumable and distributed tuning: persistent studies (SQLite, journal file, PostgreSQL), resume
after SIGKILL, several worker processes on one study."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest

from neuronmm_compiler.errors import InputError
from neuronmm_compiler.lowerings.gemm import tune_gemm
from neuronmm_compiler.schedule import GemmProblem
from neuronmm_compiler.search.storage import open_storage, storage_kind
from neuronmm_compiler.targets import get_target

pytestmark = pytest.mark.usefixtures("one_polish_start")  # storage and resume, not the polish (conftest.py)

TRN1 = get_target("trn1")
PROBLEM = GemmProblem(512, 2048, 4096)
SRC = str(Path(__file__).resolve().parent.parent / "src")
COMPLETE = optuna.trial.TrialState.COMPLETE


def _complete(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    return study.get_trials(deepcopy=False, states=(COMPLETE,))


def _sqlite_complete(path: Path) -> int:
    """COMPLETE trials in an Optuna SQLite file, read without Optuna (which would create the tables
    while the process under test may be creating them)."""
    try:
        with sqlite3.connect(path, timeout=5) as db:
            return db.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.OperationalError:  # no file or no tables yet
        return 0


def _assert_whole(url: str, name: str, at_least: int, exactly: bool = False) -> None:
    """COMPLETE trials number ``at_least`` (or exactly that) and no trial number repeats."""
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    numbers = [t.number for t in study.trials]
    assert sorted(numbers) == list(range(len(numbers)))
    complete = [t for t in study.trials if t.state == COMPLETE]
    assert len(complete) == at_least if exactly else len(complete) >= at_least


def _tune_script(url: str, *, trials: int, slow: bool) -> str:
    # A short sleep per trial (``slow``) gives the test time to kill the run mid-search.
    return (
        "import time\n"
        "from neuronmm_compiler.schedule import GemmProblem\n"
        "from neuronmm_compiler.lowerings.gemm import tune_gemm\n"
        "from neuronmm_compiler.targets import get_target\n"
        f"tune_gemm(GemmProblem(512, 2048, 4096), get_target('trn1'), trials={trials}, seed=3, storage={url!r},\n"
        f"          study_name='s', progress={'lambda d, t, b: time.sleep(0.1)' if slow else 'None'})\n"
    )


def _run_python(code: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", code], env=env, **kwargs)


#: Trials of the killed search (was 60): the kill lands after 10 complete trials, at 0.1 s of sleep each; 40 leave it
#: 30 to resume, and each of the three searches in this process runs a third fewer.
KILLED_TRIALS = 40


def test_killed_search_resumes_to_the_uninterrupted_result(tmp_path):
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    proc = _run_python(_tune_script(url, trials=KILLED_TRIALS, slow=True))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if _sqlite_complete(tmp_path / "killed.db") >= 10:
                break
        else:
            pytest.fail("the search never reached 10 complete trials")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert 10 <= len(_complete(url, "s")) < KILLED_TRIALS

    resumed = tune_gemm(PROBLEM, TRN1, trials=KILLED_TRIALS, seed=3, storage=url, study_name="s")
    _assert_whole(url, "s", KILLED_TRIALS, exactly=True)
    assert resumed.study is not None and resumed.study["trials_in_study"] == KILLED_TRIALS
    assert resumed.study["trials_run"] < KILLED_TRIALS

    fresh_url = f"sqlite:///{tmp_path / 'fresh.db'}"
    fresh = tune_gemm(PROBLEM, TRN1, trials=KILLED_TRIALS, seed=3, storage=fresh_url, study_name="s")
    assert resumed.best.schedule == fresh.best.schedule
    assert [c.schedule for c in resumed.top] == [c.schedule for c in fresh.top]
    assert [t.params for t in _complete(url, "s")] == [t.params for t in _complete(fresh_url, "s")]
    # The storage path samples exactly as the in-memory one.
    assert tune_gemm(PROBLEM, TRN1, trials=KILLED_TRIALS, seed=3).best.schedule == fresh.best.schedule


class _Stop(Exception):
    pass


def _stop_after(complete: int):
    def progress(done: int, total: int, best: float) -> None:
        if done >= complete:
            raise _Stop
    return progress


def test_an_untagged_running_trial_does_not_change_the_resumed_search(tmp_path):
    """The cause of a resumed search once differing from the uninterrupted one (1 run in 6 of the
    test above): a process killed between Optuna's ask and tagging the trial with its owner left a
    RUNNING trial without owner, which the resuming process counted as another process's live
    trial for 120 s: it salted its samples as a contended process does, and waited. Trials are now
    created already tagged (``_ask_owned``), and an untagged RUNNING trial (an older nmmc's
    leftover, made here with a bare ``ask``) is dead."""
    from neuronmm_compiler.search import trials as tr

    url = f"sqlite:///{tmp_path / 'cut.db'}"
    with pytest.raises(_Stop):
        tune_gemm(PROBLEM, TRN1, trials=40, seed=3, storage=url, study_name="s", progress=_stop_after(15))
    study = optuna.load_study(study_name="s", storage=open_storage(url))
    assert all(t.user_attrs.get("nmmc_owner") for t in study.trials)
    study.ask()  # RUNNING without owner
    started = time.monotonic()
    resumed = tune_gemm(PROBLEM, TRN1, trials=40, seed=3, storage=url, study_name="s")
    assert time.monotonic() - started < 60  # no wait for the untagged trial's "grace period"
    fresh_url = f"sqlite:///{tmp_path / 'fresh.db'}"
    fresh = tune_gemm(PROBLEM, TRN1, trials=40, seed=3, storage=fresh_url, study_name="s")
    assert [t.params for t in _complete(url, "s")] == [t.params for t in _complete(fresh_url, "s")]
    assert resumed.best.schedule == fresh.best.schedule
    assert [t.state.name for t in optuna.load_study(study_name="s", storage=open_storage(url)).trials
            ].count("RUNNING") == 0
    owned = tr._ask_owned(study, {"nmmc_owner": "h:1", "nmmc_guess": {"x": 1}})
    stored = study.get_trials(deepcopy=False)[owned.number]
    assert stored.state.name == "RUNNING" and stored.user_attrs == {"nmmc_owner": "h:1", "nmmc_guess": {"x": 1}}


def test_rerunning_a_finished_study_runs_no_trial(tmp_path):
    url = f"journal:///{tmp_path / 'done.log'}"
    first = tune_gemm(PROBLEM, TRN1, trials=25, seed=1, storage=url)
    again = tune_gemm(PROBLEM, TRN1, trials=25, seed=1, storage=url)
    assert again.study is not None and again.study["trials_run"] == 0 and again.study["trials_in_study"] == 25
    assert again.best.schedule == first.best.schedule
    assert again.search_summary()["study"]["storage"] == "journal"


def test_result_from_a_study_runs_no_trial(tmp_path):
    """The search rebuilt from the stored trials alone is the search that wrote them (best, top,
    trial count, per-trial history), and the study gains no trial."""
    from neuronmm_compiler.lowerings.gemm import gemm_search_setup
    from neuronmm_compiler.search.tuner import result_from_study

    url = f"sqlite:///{tmp_path / 'read.db'}"
    searched = tune_gemm(PROBLEM, TRN1, trials=25, seed=4, storage=url, study_name="s")
    before = _sqlite_complete(tmp_path / "read.db")
    study = optuna.load_study(study_name="s", storage=open_storage(url))
    spec, evaluate = gemm_search_setup(PROBLEM, TRN1)
    rebuilt = result_from_study(study, spec, evaluate, what=f"{PROBLEM.describe()} on {TRN1.label}", storage=url)
    assert len(study.get_trials(deepcopy=False)) == before == 25 == _sqlite_complete(tmp_path / "read.db")
    assert rebuilt.method == "optuna" and rebuilt.trials == 25
    rebuilt_in = rebuilt.study.pop("rebuilt_seconds")
    assert rebuilt.study == {"name": "s", "storage": "sqlite", "trials_in_study": 25, "trials_run": 0, "workers": 1,
                             "search_seconds": None}  # the study was not written by 'nmmc tune': no time recorded
    assert rebuilt_in > 0
    assert rebuilt.best.schedule == searched.best.schedule
    assert [c.schedule for c in rebuilt.top] == [c.schedule for c in searched.top]
    assert rebuilt.trial_history == searched.trial_history and rebuilt.candidates
    with pytest.raises(InputError, match="created for"):
        other = GemmProblem(256, 1024, 2048)
        result_from_study(study, *gemm_search_setup(other, TRN1), what=f"{other.describe()} on {TRN1.label}")
    empty = optuna.create_study(study_name="empty", storage=open_storage(url))
    with pytest.raises(InputError, match="no completed trial"):
        result_from_study(empty, spec, evaluate, what="anything")


def test_study_of_another_workload_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'other.db'}"
    tune_gemm(PROBLEM, TRN1, trials=22, storage=url, study_name="s")
    with pytest.raises(InputError, match="created for"):
        tune_gemm(GemmProblem(256, 1024, 2048), TRN1, trials=22, storage=url, study_name="s")


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_two_workers_share_one_study(tmp_path, kind):
    url = f"{kind}:///{tmp_path / 'shared'}.{'log' if kind == 'journal' else 'db'}"
    result = tune_gemm(PROBLEM, TRN1, trials=40, seed=2, storage=url, study_name="w", workers=2)
    _assert_whole(url, "w", 40, exactly=True)
    assert result.study is not None and result.study["workers"] == 2
    assert result.study["trials_in_study"] == 40  # never over: a trial asked for no free slot does not run
    assert result.best.cost.feasible and all(c.cost.feasible for c in result.top)
    owners = {t.user_attrs.get("nmmc_owner") for t in _complete(url, "w")}
    # Usually both workers ran trials; on a loaded machine one may finish before the other has
    # started (spawning a worker imports nmmc), which loses nothing: every trial number is there once.
    assert 1 <= len(owners) <= 3 and None not in owners  # every trial is attributed to the process that ran it


def test_bad_storage_arguments_are_input_errors(tmp_path):
    for url in ["", "mysql://x/y", "sqlite://", "journal:///", "redis://localhost", str(tmp_path / "x.db")]:
        with pytest.raises(InputError, match="accepted forms"):
            storage_kind(url)
    with pytest.raises(InputError, match="needs a storage"):
        tune_gemm(PROBLEM, TRN1, trials=22, workers=2)


def test_postgresql_study():
    url = os.environ.get("NMMC_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("NMMC_TEST_POSTGRES_URL is unset in CI: .ci/run must start PostgreSQL and export it")
        pytest.skip("NMMC_TEST_POSTGRES_URL is unset (set it to a postgresql:// URL to run this test)")
    name = f"nmmc-test-{uuid.uuid4().hex[:12]}"
    try:
        result = tune_gemm(PROBLEM, TRN1, trials=30, seed=5, storage=url, study_name=name, workers=2)
        _assert_whole(url, name, 30, exactly=True)
        assert result.study is not None and result.study["storage"] == "postgresql"
        assert result.best.cost.feasible
        again = tune_gemm(PROBLEM, TRN1, trials=30, seed=5, storage=url, study_name=name)
        assert again.study is not None and again.study["trials_run"] == 0
    finally:
        optuna.delete_study(study_name=name, storage=open_storage(url))


CLI = "import sys; from neuronmm_compiler.cli import main; sys.argv[0] = 'nmmc'; main()"


def _concurrent_tunes(url: str, study: str, out_dir: Path, *, processes: int, workers: int, trials: int) -> None:
    """``processes`` separate ``nmmc tune --workers W`` runs on one study, started together: each
    exits 0 without a traceback and writes its kernel (the same kernel), and the study ends with
    exactly ``trials`` COMPLETE trials (surplus trials asked at the end are FAIL, never run)."""
    args = ["tune", "--shape", "128x512x256", "--method", "optuna", "--trials", str(trials), "--seed", "7",
            "--storage", url, "--study", study, "--workers", str(workers), "--no-cache", "--no-progress", "--json"]
    outs = [out_dir / f"kernel{i}.py" for i in range(processes)]
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", CLI, *args, "-o", str(out)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for out in outs]
    try:
        results = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for proc, out, (_, err) in zip(procs, outs, results, strict=True):
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
        assert out.is_file() and "def " in out.read_text()
    _assert_whole(url, study, trials, exactly=True)
    summaries = [json.loads(stdout)["search"]["study"] for stdout, _ in results]
    assert all(s["trials_in_study"] == trials for s in summaries)
    assert sum(s["trials_run"] for s in summaries) == trials  # each trial is counted by the process that ran it
    # Each process rebuilds its result from all the COMPLETE trials in trial order: one kernel.
    assert len({out.read_text() for out in outs}) == 1


def test_concurrent_processes_and_workers_sqlite(tmp_path):
    """Two processes of two workers each (four trial loops) on a fresh SQLite file: they race to create the tables,
    the study and the last trials, and end with exactly the requested trials. (Each further process costs three
    interpreters and a polish for no other race; test_processes_racing_to_create_a_sqlite_storage races more.)"""
    _concurrent_tunes(f"sqlite:///{tmp_path / 'race.db'}", "race", tmp_path, processes=2, workers=2, trials=24)


def test_concurrent_processes_and_workers_postgresql(tmp_path):
    url = os.environ.get("NMMC_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("NMMC_TEST_POSTGRES_URL is unset in CI: .ci/run must start PostgreSQL and export it")
        pytest.skip("NMMC_TEST_POSTGRES_URL is unset (set it to a postgresql:// URL to run this test)")
    name = f"nmmc-race-{uuid.uuid4().hex[:12]}"
    try:
        _concurrent_tunes(url, name, tmp_path, processes=2, workers=2, trials=24)
    finally:
        optuna.delete_study(study_name=name, storage=open_storage(url))


def test_a_trial_runs_only_in_a_free_slot():
    """The slot check after ``ask``: live RUNNING trials of lower number and COMPLETE trials take
    slots; a trial of a dead process on this host, an untagged one, or this process's own
    leftover, does not."""
    import socket

    from neuronmm_compiler.search import trials as tr

    study = optuna.create_study(direction="minimize")
    study.tell(study.ask(), 1.0)  # 0: COMPLETE
    other_host = study.ask()  # 1: RUNNING on another host: may finish
    other_host.set_user_attr("nmmc_owner", "some-other-host:1")
    dead = study.ask()  # 2: RUNNING, its process on this host is gone
    dead.set_user_attr("nmmc_owner", f"{socket.gethostname()}:{_dead_pid()}")
    study.ask()  # 3: RUNNING without owner tag (nmmc creates trials tagged): dead
    mine = study.ask()  # 4
    mine.set_user_attr("nmmc_owner", tr._owner_tag())
    assert not tr._slot_is_free(study, mine.number, 2, tr._owner_tag())
    assert tr._slot_is_free(study, mine.number, 3, tr._owner_tag())
    assert tr._fail_dead_trials(study) == 2
    assert [t.state.name for t in study.trials] == ["COMPLETE", "RUNNING", "FAIL", "FAIL", "RUNNING"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _race_to_open(url: str, processes: int = 4) -> None:
    """``processes`` processes open (create) study "s" on ``url`` at the same instant: all succeed."""
    code = ("import sys, time\nfrom neuronmm_compiler.search.trials import _open_study\n"
            "start = float(sys.argv[2])\nwhile time.time() < start:\n    time.sleep(0.001)\n"
            "_open_study(sys.argv[1], 's')\n")
    start = time.time() + 3.0  # every interpreter has imported Optuna by then
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", code, url, str(start)], stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(processes)]
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * processes, "\n".join(errors)
    assert [s.study_name for s in optuna.get_all_study_summaries(open_storage(url))] == ["s"]


def test_processes_racing_to_create_a_sqlite_storage(tmp_path):
    """Creating the tables is not atomic across processes ("table studies already exists", a
    unique violation on Alembic's version row): the losers retry."""
    _race_to_open(f"sqlite:///{tmp_path / 'fresh.db'}")


def test_processes_racing_to_create_a_postgresql_storage():
    """On PostgreSQL the losers of the race to create the tables meet a unique violation
    (pg_type_typname_nsp_index) and retry. The tables go to a fresh schema of the test database."""
    url = os.environ.get("NMMC_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("NMMC_TEST_POSTGRES_URL is unset in CI: .ci/run must start PostgreSQL and export it")
        pytest.skip("NMMC_TEST_POSTGRES_URL is unset (set it to a postgresql:// URL to run this test)")
    import sqlalchemy

    schema = f"nmmc_race_{uuid.uuid4().hex[:12]}"
    engine = open_storage(url).engine  # SQLAlchemy's engine with the driver nmmc picks
    with engine.begin() as db:
        db.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    try:
        _race_to_open(f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}")
    finally:
        with engine.begin() as db:
            db.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))


def test_a_sqlite_storage_commits_without_syncing_the_disk_each_time(tmp_path):
    """Optuna commits ~20 times per trial (one per suggested parameter): with SQLite's defaults (rollback
    journal, synchronous=FULL) each commit waited for the disk, most of a stored search's time (issue 28:
    12x the in-memory search here, 23 s on a loaded machine). The storage runs in WAL mode with
    synchronous=NORMAL on every connection, the schema's included."""
    storage = open_storage(f"sqlite:///{tmp_path / 'fast.db'}")
    with storage.engine.connect() as connection:
        cursor = connection.connection.cursor()
        assert cursor.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    with sqlite3.connect(tmp_path / "fast.db") as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # recorded in the file
