"""Tensor parallelism for gated MLPs: sharding (:mod:`.sharding`), strategy choice with collectives in the
cost (:mod:`.planner`), the plan and kernel files (:mod:`.plan`), multi-rank verification (:mod:`.verify`);
docs/tensor-parallel.md."""
