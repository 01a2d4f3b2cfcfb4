"""What nmmc's model of AWS nki-library's MLP is read from, and what it says where that kernel does not run (shared
by :mod:`.nkilib_mlp`, :mod:`.nkilib_tkg` and :mod:`.nkilib_cte`).

The newest nki-library source that can be read is not one commit. The fetched snapshot of aws-neuron/nki-library
ends at d2ad3a57 ("NKI Lib 2026-04-13", between the Neuron 2.29 and 2.30 releases), whose ``core/mlp/mlp.py`` does
not parse (its docstring's tail is pasted twice, lines 203-213). The code index holds some files of two later
commits: 092a49dc, whose ``mlp_cte/basic/`` and ``mlp_cte/mx/`` split is the refactor the Neuron 2.32.0 release notes
(08/17/2026, "MLP CTE") describe, and e9ef98fc, later still (its README adds the DeepSeek V3.2 MX MLP kernel). Each
part of the model is read from the newest commit at which every file it needs can be read:

* the entry point (``mlp.py``: the 200 KiB SBUF manager of the decode path) and the selection (``mlp_parameters.py``:
  ``TKG_BS_SEQLEN_THRESHOLD = 96``, ``is_mlp_tkg``): 092a49dc (:data:`NKILIB_SELECT_COMMIT`);
* the decode kernel (``mlp_tkg/``): d2ad3a57 (:data:`NKILIB_TKG_COMMIT`); the index holds no later version of
  ``mlp_tkg.py``, ``mlp_tkg_constants.py``, ``mlp_tkg_gate_up_projection.py``, ``mlp_tkg_down_projection.py`` or
  ``mlp_tkg_utils.py`` (the 2.30 release notes name changes to them, "Fixed MLP TKG weight tile allocation size and
  fallback logic", that no readable file shows);
* the prefill kernel (``mlp_cte/basic/``, ``mlp_cte_sharding.py``, ``mlp_cte_constants.py``): 092a49dc
  (:data:`NKILIB_CTE_COMMIT`). e9ef98fc changes it again (it splits on the intermediate dim from 4096 columns on, up
  to 8 gate/up weight buffers, a gate/up loop over 512-column tiles of I), but its ``mlp_cte_basic.py`` and
  ``mlp_cte_basic_allocation.py`` are not stored, so that version is not modelled.
"""

from __future__ import annotations

from ..errors import ScheduleError

#: aws-neuron/nki-library commit of the decode kernel nmmc models (``mlp_tkg/``; "NKI Lib 2026-04-13").
NKILIB_TKG_COMMIT = "d2ad3a579498d1888aa8740af97fd325dd5f2740"
#: aws-neuron/nki-library commit of the prefill kernel nmmc models (``mlp_cte/basic/``; the Neuron 2.32 refactor).
NKILIB_CTE_COMMIT = "092a49dcdffb3ee0d63dbb71abd65dc70ca80821"
#: aws-neuron/nki-library commit of the entry point and the decode/prefill selection (``mlp.py``,
#: ``mlp_parameters.py``).
NKILIB_SELECT_COMMIT = "092a49dcdffb3ee0d63dbb71abd65dc70ca80821"
#: The commit the older one-commit model read every constant from (kept for the FP8 decode path's citations, which
#: are unchanged: it is the decode kernel's commit).
NKILIB_COMMIT = NKILIB_TKG_COMMIT


def nkilib_commit(variant: str) -> str:
    """The nki-library commit the model of ``variant`` (``tkg`` or ``cte``) is read from."""
    return NKILIB_TKG_COMMIT if variant == "tkg" else NKILIB_CTE_COMMIT


class NotModelled(ScheduleError):
    """nki-library's kernel does not run this workload (one of its asserts), or nmmc does not model the case."""


class DoesNotRun(NotModelled):
    """nki-library's kernel does not run this workload: one of its asserts (or its allocator) stops it at trace time,
    so a model graph that calls it does not compile."""
