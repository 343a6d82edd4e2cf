"""PyTorch workers on the PS beside DistributedDataParallel and a torch.distributed.rpc parameter
server: ``python -m bench.torch`` (see ``__main__``); each training process is ``python -m
bench.torch.workers SPEC_JSON`` (``workers``).

This package is ``bench.torch``, never a top-level ``torch``: its modules import the real torch
package with absolute imports, and no folder of theirs goes on sys.path.
"""
