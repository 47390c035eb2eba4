"""Tiny and trained zoo models, their demo pools and training (tests, the demo and benchmarks); the
tasks and media they train on live in quantkit.synthetic."""
