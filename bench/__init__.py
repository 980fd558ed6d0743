"""tiny's benchmark suite: `python -m bench.run` times each workload on tiny and on NumPy, PyTorch and tinygrad in
the same run, and reports tiny's ratio against each. See bench/README.md."""
