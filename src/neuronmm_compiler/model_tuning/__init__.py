"""``nmmc tune --model``: a model's MLP tuned per token bucket, in the formats its layers allow.

- :mod:`.pipeline`: from a model (a Hugging Face directory, a shipped config or an ``nmmc compress`` output) to
  tuned kernels and their index;
- :mod:`.formats`: the formats chosen among per bucket ({dense, SVD} x {bf16, FP8});
- :mod:`.groups`: layers of different ranks or formats, one kernel per group;
- :mod:`.entries`: the index entries per bucket;
- :mod:`.report`: the table printed, one row per bucket.
"""
