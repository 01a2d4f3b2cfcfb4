"""SIGKILL and resume of ``--heal finetune``'s distillation on a real model (issue 27): an uninterrupted run,
then the same run killed with SIGKILL after a checkpoint, then its resume; the resumed factors are compared
with the uninterrupted run's.

    python benchmarks/finetune_kill_resume.py MODEL_DIR --start START.pkl [--steps 12 --work /tmp/ftkill]

``START.pkl`` is ``benchmarks/finetune_sweep.py``'s cache (calibration ids and the closed form's factors).
Checkpoints every 20 s; the kill comes once a checkpoint exists and at least ``--kill-after`` steps ran.
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def child(mode: str, model_dir: str, start_path: str, steps: int, work: Path) -> None:
    from neuronmm_compiler.compression.finetune import FinetuneSettings, finetune_heal
    from neuronmm_compiler.compression.forward import CausalLM

    model = CausalLM(model_dir)
    with open(start_path, "rb") as f:
        start = pickle.load(f)
    ckpt = work / "run.ckpt"
    t0 = time.time()

    def on_step(step: int, total: int, kl: float) -> None:
        print(f"step {step} KL {kl:.4f} wall {time.time() - t0:.0f} checkpoint {ckpt.exists()}", flush=True)

    tuned, record = finetune_heal(model, start["ids"], start["healed"],
                                  settings=FinetuneSettings(steps=steps, samples=0, checkpoint_seconds=20.0),
                                  checkpoint=None if mode == "whole" else ckpt, on_step=on_step, in_place=True)
    flat = {f"{layer}.{p}.{i}": t for layer, d in tuned.items() for p, f in d.items() if isinstance(f, tuple)
            for i, t in enumerate(f)}
    print(f"{mode}: resumed at step {record['resumed_at_step']}, {record['seconds']} s", flush=True)
    if mode == "whole":
        np.savez(work / "whole.npz", **flat)
        return
    ref = np.load(work / "whole.npz")
    diff = max(float(np.abs(ref[k] - v).max()) for k, v in flat.items())
    print(f"max abs difference from the uninterrupted run: {diff:g}; bitwise equal: "
          f"{all(np.array_equal(ref[k], v) for k, v in flat.items())}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--start", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--kill-after", type=int, default=8)
    ap.add_argument("--work", default="/tmp/nmmc-finetune-kill")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = Path(a.work)
    if a.child:
        child(a.child, a.model_dir, a.start, a.steps, work)
        return
    work.mkdir(parents=True, exist_ok=True)
    (work / "run.ckpt").unlink(missing_ok=True)
    cmd = [sys.executable, __file__, a.model_dir, "--start", a.start, "--steps", str(a.steps), "--work", str(work)]
    subprocess.run([*cmd, "--child", "whole"], check=True)
    proc = subprocess.Popen([*cmd, "--child", "killed"], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        print(line, end="", flush=True)
        if line.startswith("step ") and line.rstrip().endswith("checkpoint True") and \
                int(line.split()[1]) >= a.kill_after:
            os.kill(proc.pid, signal.SIGKILL)
            print(f"SIGKILL after {line.strip()}", flush=True)
            break
    proc.wait()
    subprocess.run([*cmd, "--child", "resume"], check=True)


if __name__ == "__main__":
    main()
