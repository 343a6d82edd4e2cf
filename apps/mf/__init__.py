"""SGD matrix factorization on Bösen-py: tables L (users x rank) and R (items x rank).

Run with ``bosen launch configs/mf.yaml``; the worker is ``bosen.apps.mf.worker.train``.
"""
