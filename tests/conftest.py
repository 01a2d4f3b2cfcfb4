"""Shared helpers for the test suite."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

# One BLAS and OpenMP (torch) thread per test process unless the caller chose: the suite runs a worker per core
# (pytest -n auto), and each one's libraries starting a thread per core oversubscribed the machine (OpenBLAS's
# threads spin while they wait): the whole suite took 462 s on an idle 2-core host, 385 s with one thread each.
# This must run before numpy or torch is imported; test_repo.py checks that it did. Tests that pass --threads still
# get what they ask for (nmmc sets the threads itself, through threadpoolctl and torch.set_num_threads).
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

# Bytecode while collecting, where PYTHONDONTWRITEBYTECODE forbids it (as on the shared 2-core machine): each test
# worker rewrote and compiled every test module (pytest's assertion rewriting) and the package from source, and so
# did every nmmc process a test starts. While the tests are collected the bytecode of the test modules and of the
# package they import is written, beside them in __pycache__ (ignored by git); the processes tests start read it.
# Afterwards nothing more is written, so a temporary file a test imports (a kernel, an exported package) gets no
# __pycache__ beside it. Collection took 11.7 CPU s per process before, 5.9 once written.
_BYTECODE_WHILE_COLLECTING = sys.dont_write_bytecode
sys.dont_write_bytecode = False

import signal  # noqa: E402

# Ctrl-C reaches the tests' own processes: a shell that starts a command in the background without job control (`cmd
# &` in a script, nohup) makes it ignore SIGINT, an ignored signal stays ignored across exec, and Python then installs
# no KeyboardInterrupt handler. The tests of Ctrl-C (test_outputs, test_finetune_resume, test_tp_finetune) sent a
# SIGINT that nothing received: four failures, one of them after a 120 s wait for an nmmc search that went on. With
# Python's handler back, this process raises KeyboardInterrupt and the nmmc processes it starts get SIGINT's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from helpers import compile_gemm  # noqa: E402
from neuronmm_compiler.verification import verify_source  # noqa: E402
from neuronmm_compiler.workers import cores as _cores  # noqa: E402


def _cores_per_test_worker() -> None:
    """Each pytest-xdist worker takes its share of the cores (2 cores, -n 2: one each), as the BLAS threads above
    do. nmmc's defaults follow the cores it may use (``tune --model --jobs``: a spawned process per core, each
    importing nmmc again; an SVD MLP's dense baseline and the polish in a second process when a core is idle;
    ``compress --threads``): in a test worker those processes and threads only took the other worker's core. The
    tests of those paths ask for them (``--jobs 2``, tests/test_search_parallel.py patches ``idle_core``), and
    their output is that of one process, which the tests check. Without xdist nothing changes."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2:
        return
    original = _cores.available_cores
    share = max(original() // workers, 1)

    def available_cores() -> int:
        return share

    _cores.available_cores = available_cores
    for module in list(sys.modules.values()):  # modules that bound the function before this ran
        if getattr(module, "available_cores", None) is original:
            module.available_cores = available_cores


_cores_per_test_worker()


#: Bytes of verification inputs a test process keeps for reuse (the least recently used are dropped first).
SHARED_INPUT_BYTES = 256 << 20


def _shared_verification_inputs() -> None:
    """Verification draws each kernel's inputs from a seeded generator (``verification.random_inputs``): the same
    arguments and seed give the same arrays. The suite verifies many kernels of one signature (a shape's GEMM in
    each dialect and layout, an MLP's tuned and default schedules), and drawing and rounding them to bfloat16 took
    16.7 CPU s of the suite (985 draws of 327 signatures, 11.5 s of it repeats; 1.7 s for nine draws of one
    1x4096x4096 GEMM's). So a test process draws each signature once and hands out copies (a copy: no test sees
    another's writes); what it keeps is bounded by SHARED_INPUT_BYTES. Modules that bound the function by name
    before this ran keep drawing."""
    from collections import OrderedDict

    from neuronmm_compiler import verification

    draw = verification.random_inputs
    kept: OrderedDict[tuple, dict] = OrderedDict()
    held = [0]  # bytes in ``kept``

    def nbytes(arrays: dict) -> int:
        return sum(array.nbytes for array in arrays.values())

    def random_inputs(specs, seed: int) -> dict:
        specs = list(specs)
        key = (tuple((spec.name, tuple(spec.shape), spec.dtype) for spec in specs), seed)
        if key in kept:
            kept.move_to_end(key)
        else:
            kept[key] = draw(specs, seed)
            held[0] += nbytes(kept[key])
            while len(kept) > 1 and held[0] > SHARED_INPUT_BYTES:
                held[0] -= nbytes(kept.popitem(last=False)[1])
        return {name: array.copy() for name, array in kept[key].items()}

    verification.random_inputs = random_inputs


_shared_verification_inputs()

settings.register_profile(
    "nmmc", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("nmmc")


def compile_and_verify(m: int, n: int, k: int, *, seed: int = 0, **options):
    """Compile a GEMM, run it in the interpreter, return (compiled, report); fails on mismatch."""
    compiled = compile_gemm(m, n, k, **options)
    report = verify_source(compiled.kernel.source, filename=f"<gemm {m}x{n}x{k}>", seed=seed)
    assert report.ok, f"{m}x{n}x{k} {options}: {report.error}"
    return compiled, report


#: Tests recorded (cpu_seconds.json, written by scripts/suite_cpu.py) at this many CPU seconds or more are marked
#: ``slow``; ``pytest -m "not slow"`` runs the others, the quick subset (README, docs/ci.md).
SLOW_SECONDS = 0.2
CPU_SECONDS = Path(__file__).with_name("cpu_seconds.json")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` the tests recorded at SLOW_SECONDS or more, and the tests of their file that request one of the
    file's own module (or wider) fixtures such a test requests: that fixture's cost was recorded on the first test
    that used it, and without that test the next one would pay it in the quick subset."""
    recorded = json.loads(CPU_SECONDS.read_text(encoding="utf-8"))["tests"] if CPU_SECONDS.is_file() else {}

    def shared(item: pytest.Item) -> set[tuple[str, str]]:
        module = item.nodeid.split("::", 1)[0]
        info = getattr(item, "_fixtureinfo", None)
        return {(module, name) for name, defs in (info.name2fixturedefs.items() if info else ())
                if defs and defs[-1].scope != "function" and defs[-1].baseid == module}

    slow = {item for item in items if recorded.get(item.nodeid, 0.0) >= SLOW_SECONDS}
    expensive = set().union(*map(shared, slow)) if slow else set()
    for item in items:
        if item in slow or shared(item) & expensive:
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Bytecode is written only while collecting (see the top of this file)."""
    sys.dont_write_bytecode = _BYTECODE_WHILE_COLLECTING


#: Resident memory this worker may gain before a test releases what earlier tests left frozen.
RELEASE_AFTER_BYTES = 256 << 20
_released_at: list[int] = [0]
_last_file: list[str] = [""]


def _resident_bytes() -> int:
    """This process's resident memory in bytes (from Linux's /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Keep the garbage collector's full collections cheap: before each test, what is alive is moved out of its reach
    (``gc.freeze``), so a full collection scans only what the test allocates. Verification calls ``gc.collect()`` after
    every kernel it runs (the interpreter's machine sits in reference cycles), and in a test worker that had every
    test collected and earlier modules' objects alive each call scanned 88,000-270,000 objects: 50-140 ms a kernel,
    42% of test_gemm_kernels.py's CPU time.

    Frozen objects that die are still freed by their reference counts; only cycles among them wait for a release
    (``gc.unfreeze`` and a collection of everything: 0.2-0.5 s over the worker's 400,000-800,000 live objects, most of
    them the modules and collected tests). Releasing at every test file cost 42 CPU s of the suite (117 files), and
    what it freed was small: the live objects grew by imports, not by leftovers. So a test releases only once the
    worker's resident memory has grown by RELEASE_AFTER_BYTES since the last release (where it cannot be read, as
    before: at each test file's first test)."""
    module = item.nodeid.split("::", 1)[0]
    new_file, _last_file[0] = module != _last_file[0], module
    resident = _resident_bytes()
    release = resident - _released_at[0] > RELEASE_AFTER_BYTES if resident else new_file
    if release:
        gc.unfreeze()
    gc.collect()
    if release:
        _released_at[0] = _resident_bytes()
    gc.freeze()


@pytest.fixture(autouse=True)
def private_result_cache(tmp_path, monkeypatch):
    """Every test gets its own empty result cache (nmmc tune reads and writes one by default)."""
    monkeypatch.setenv("NMMC_CACHE_DIR", str(tmp_path / "nmmc-cache"))


@pytest.fixture
def verify_gemm():
    return compile_and_verify


@pytest.fixture(scope="module")
def one_blas_thread():
    """One BLAS thread for a module of tiny matrices: more threads only spin against each other and the other test
    workers on a busy machine (``pytestmark = pytest.mark.usefixtures("one_blas_thread")``)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def one_polish_start():
    """One polish start per search instead of ``search.tuner.POLISH_STARTS`` (8), for a module of tests of what
    surrounds a search -- the CLI, files, manifests, exports, caches, lockfiles -- not of the search itself
    (``pytestmark = pytest.mark.usefixtures("one_polish_start")``). Module-scoped, so the searches of the module's
    fixtures are shortened too. Like a small ``--trials``, it changes which schedule wins, never what these tests
    assert: each assertion holds for any search result (the files that use it passed unchanged with it; 16 of them took
    215 CPU s without it and 149 with it, -n 2 on the idle machine). The polish from every start is what test_golden's
    tuned kernels, test_trust's tuned rows, test_rotation_room and test_search_*.py check, and they keep it. A search in
    a spawned worker process (``--jobs 2``) keeps the default: the fixture patches this process (and forked children)
    only, so a test comparing such a worker's search with one in this process restores the default it yields."""
    from neuronmm_compiler.search import tuner

    with pytest.MonkeyPatch.context() as patch:
        default = tuner.POLISH_STARTS
        patch.setattr(tuner, "POLISH_STARTS", 1)
        yield default


#: A test not in CPU_SECONDS (under its RECORD_SECONDS, 0.1) counts this much when files are ordered below.
UNRECORDED_SECONDS = 0.03


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``-n auto`` (``--dist load``, or README's ``--dist loadfile``): each test file runs whole in one worker (its
    module fixtures built once), and the files go out longest first by their recorded CPU seconds (the longest
    processing time rule). pytest-xdist's loadfile sends the files with the most tests first, which left a file of
    few long tests (test_trust.py, test_model_pipeline.py) to start late and one core idle at the end."""
    if config.getvalue("dist") not in ("load", "loadfile"):
        return None
    from xdist.scheduler import LoadFileScheduling

    recorded = json.loads(CPU_SECONDS.read_text(encoding="utf-8"))["tests"] if CPU_SECONDS.is_file() else {}

    class LongestFileFirst(LoadFileScheduling):
        _ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:
                self._ordered = True
                files = sorted(self.workqueue.items(), key=lambda unit: -sum(
                    recorded.get(nodeid, UNRECORDED_SECONDS) for nodeid in unit[1]))
                self.workqueue.clear()
                self.workqueue.update(files)
            super()._assign_work_unit(node)

    return LongestFileFirst(config, log)
