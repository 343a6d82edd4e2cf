"""SGD matrix factorization on Bösen-py: ratings r ≈ L_u · R_i, tables L (users x rank) and R (items x rank).

``data`` (ratings: CSV reader, generator, partition), ``kernels`` (numba SGD and loss), ``model``
(a mini-batch's rows and step), ``worker`` (``train``: the loop against the PS). Run with
``bosen launch configs/mf.yaml``.
"""

ELASTIC = True  # workers may join and leave a running job (bosen scale): micro-tasks move to them
