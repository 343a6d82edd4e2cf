"""Latent Dirichlet allocation by collapsed Gibbs sampling on Bösen-py, word-topic counts in the PS.

``data`` (UCI and LDA-C readers, generator, writers), ``sampling`` (numba samplers: dense, sparse,
LightLDA MH), ``evaluation`` (numba log-likelihood terms and document completion), ``model`` (the
sampler state and objective), ``consistent`` (the objective of the servers' tables at a clock),
``worker`` (``train``: the loop against the PS). Run with
``bosen launch configs/lda.yaml``.
"""

ELASTIC = True  # workers may join and leave a running job (bosen scale): micro-tasks move to them
