"""Multiclass logistic (softmax) regression on Bösen-py: data-parallel minibatch SGD, weights in the PS.

``python -m bosen.apps.mlr`` is the worker; ``configs/mlr.yaml`` a job; ``bench.py`` the kernel and
scaling benchmarks. See worker.py for the table layout and what one clock does.
"""
