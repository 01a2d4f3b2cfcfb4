"""One workload tuned as a user asks for it: ``nmmc tune``, ``emit``, ``cost`` and ``explain`` above the driver.

- :mod:`.request`: a tune request end to end (the result cache, the search, the baselines, verification);
- :mod:`.dense_baseline`: nmmc's own dense kernel as a baseline of an SVD or FP8 MLP;
- :mod:`.speedups`: how a speedup is stated (launch context, slowdowns, how far to trust it);
- :mod:`.report`: the text and JSON printed about compiled, costed and tuned workloads.

Nothing is imported here, so a module that needs only :mod:`.speedups` does not load the search.
"""
