"""Calibration of the cost model against measured latencies (``nmmc calibrate``, ``nmmc bench``)."""
