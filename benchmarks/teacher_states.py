"""Fine-tuning's teacher targets from the tokens (the torch forward pass) against from the calibration pass's final
hidden states (the LM head alone), side by side on the real model.

    python benchmarks/teacher_states.py MODEL_DIR --text WORK/texts/docs-cal.txt [--sequences 12] [--rounds 3]

Calibrates ``--sequences`` 512-token sequences of ``--text`` with ``keep_final=256`` (what ``compress --heal
finetune`` does), then computes each 256-token fine-tuning sequence's top-64 teacher targets both ways, the two
alternating per sequence so that a change in the machine's load hits both; prints the median seconds a sequence of
each and their ratio, and how far the two targets differ (the largest difference of a kept log-probability, and
the share of tokens whose top-64 token sets differ).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from neuronmm_compiler.compression.calibration import calibrate, load_tokens, sequences
from neuronmm_compiler.compression.finetune import FinetuneSettings, import_torch, teacher_states
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.torch_lm import TorchLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--text", required=True)
    ap.add_argument("--sequences", type=int, default=12, help="512-token calibration sequences")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch = import_torch()
    torch.set_num_threads(a.threads)
    settings = FinetuneSettings()
    model = CausalLM(a.model_dir)
    lm = TorchLM(model, torch)
    ids = load_tokens(a.text, a.model_dir, 512 * a.sequences)
    cal = calibrate(model, ids, source="bench", length=512, keep_final=settings.length)
    known = teacher_states(cal.final, 512, settings)
    chunks = sequences(ids, settings.length)
    print(f"{len(known)} of {len(chunks)} fine-tuning sequences start a calibration sequence", flush=True)

    def from_tokens(i: int):
        with torch.no_grad():
            hidden = lm.hidden(torch.from_numpy(chunks[i][None].astype(np.int64)))[0]
            return torch.log_softmax(hidden @ lm.lm_head, -1).topk(settings.top_k, dim=-1)

    def from_states(i: int):
        with torch.no_grad():
            return torch.log_softmax(torch.from_numpy(known[i]) @ lm.lm_head, -1).topk(settings.top_k, dim=-1)

    times: dict[str, list[float]] = {"tokens": [], "states": []}
    worst, differ, count = 0.0, 0, 0
    for _ in range(a.rounds):
        for i in sorted(known):
            out = {}
            for name, fn in (("tokens", from_tokens), ("states", from_states)):
                began = time.perf_counter()
                out[name] = fn(i)
                times[name].append(time.perf_counter() - began)
            (lt, it), (ls, is_) = out["tokens"], out["states"]
            same = (it.sort(-1).values == is_.sort(-1).values).all(-1)
            differ += int((~same).sum())
            count += int(same.numel())
            worst = max(worst, float((lt - ls).abs()[same].max()) if bool(same.any()) else 0.0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"teacher targets a sequence, median of {len(times['tokens'])} alternating: from the tokens "
          f"{med['tokens']:.3f} s, from the calibration states {med['states']:.3f} s (ratio "
          f"{med['states'] / med['tokens']:.2f})")
    print(f"targets: largest log-probability difference {worst:.2e} (tokens whose top-{settings.top_k} sets agree), "
          f"top-{settings.top_k} sets differ on {differ} of {count} tokens")


if __name__ == "__main__":
    main()
