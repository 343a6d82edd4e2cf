"""One worker of the DLRM example's synchronous path (tests/apps/pytorch/test_dlrm.py): runs
``dlrm.train_sync`` with the JSON ``--args``, then writes to ``--out`` the values it ends on (w_T): the
dense parameters it pulled, every row of each embedding table, read at its final tick, and rank 0's
held-out AUC at each eval point."""

from __future__ import annotations

import argparse
import json

import numpy as np

from bosen.apps.pytorch.examples import dlrm
from bosen.apps.pytorch.ranks import connect
from bosen.config import from_dict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--args", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    client = connect(args.config)
    a = from_dict(dlrm.DLRMArgs, json.loads(args.args), "app.args")
    _, m = dlrm.train_sync(client, a)
    emb = {f"emb{i}": t.get_rows(np.arange(e.rows, dtype=np.int64))
           for i, (e, t) in enumerate(zip(m.layout.sparse, m.sparse_tables, strict=True))}
    auc = [r["heldout_auc"] for r in client.reports if "heldout_auc" in r]  # rank 0's, at the eval points
    np.savez(args.out, dense=m.values(), iteration=np.array([m.iteration, client.tick]), auc=np.array(auc), **emb)
    m.close()
    client.close()


if __name__ == "__main__":
    main()
