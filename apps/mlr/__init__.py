"""Multiclass logistic (softmax) regression on Bösen-py: data-parallel minibatch SGD, weights in the PS.

``data`` (libsvm reader, generator, digits, splits), ``kernels`` (numba SGD and evaluation),
``model`` (the local weight copy), ``worker`` (``train``: the loop against the PS). Run with
``bosen launch configs/mlr.yaml``.
"""

ELASTIC = True  # workers may join and leave a running job (bosen scale): micro-tasks move to them
SYNC_ELASTIC = True  # its synchronous path (a backup table, any mode) reads the task plan at every clock too
