"""PyTorch workers whose parameters live in the parameter server (docs/pytorch.md).

A training loop keeps its forward / backward / step shape::

    model = PSModule(Net(), client, clock_every=4)      # pulls the parameters before each forward
    opt = ServerOptimizer(model, "adagrad", lr=0.05)    # pushes gradients; the server takes the step
    # or DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))  # steps here, pushes deltas

The tables are declared from the model (``declare``), not written by hand, and ``PSModule`` checks
them against the job's config, which every server shares.
"""

from bosen.apps.pytorch.embedding import PSEmbedding, hash_ids
from bosen.apps.pytorch.layout import DEFAULT_ROW_WIDTH, Layout
from bosen.apps.pytorch.module import PSModule
from bosen.apps.pytorch.optim import DeltaOptimizer, ServerOptimizer
from bosen.apps.pytorch.ranks import Ranks, ranks_from_env
from bosen.apps.pytorch.tables import declare

__all__ = ["PSModule", "ServerOptimizer", "DeltaOptimizer", "Layout", "DEFAULT_ROW_WIDTH", "declare", "Ranks",
           "ranks_from_env", "PSEmbedding", "hash_ids"]
