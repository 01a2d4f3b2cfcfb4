"""The kernel IR: loop-nest programs (loops, on-chip buffers, the NKI-subset instructions) with
affine index expressions. Lowerings produce it; the cost model, the footprint check and the
dialect printers read it."""
