"""Benchmark harness shared by every rownorm op: ``python -m rownorm.bench``.

For each op × mode (fwd, fwd+bwd) × dtype × row length N on a fixed grid (M·N ≥ 2^28 elements,
far beyond L2), every implementation (rownorm, eager PyTorch, torch.compile of the eager
expression, Liger-Kernel when importable and offering the op) is first checked against the
float64 reference and then timed: median of many reps with CUDA events, the L2 cache flushed
before each rep, only the op inside the events. Bandwidth is counted from an explicit per-op
byte formula (the minimum traffic) and reported as a share of the device-to-device copy
bandwidth measured in the same run. fwd+bwd is a training step: the gradient of x and of every
parameter (weight, bias) is computed.

Modules, each importable on its own (``import rownorm`` imports none of them):

- :mod:`~rownorm.bench.specs`: the op table (inputs, implementations, byte formulas, seeds);
- :mod:`~rownorm.bench.impls`: rownorm's implementation and the peers (eager, compile, Liger);
- :mod:`~rownorm.bench.check`: correctness against the float64 reference;
- :mod:`~rownorm.bench.timer`: the timer, the copy limit, the small-call costs;
- :mod:`~rownorm.bench.runner`: the configurations and the measuring loop;
- :mod:`~rownorm.bench.report`: ``results.md``, ``results.csv`` and the plots;
- :mod:`~rownorm.bench.cli`: the command line.

It stays inside the package (rather than under ``benchmarks/``) so that ``python -m
rownorm.bench`` runs against an installed wheel, with no checkout, on the machine being
measured. This file imports nothing, so that a tool needing one part (the timer, say) loads only
that part and what it imports.
"""
