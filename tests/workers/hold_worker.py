"""Joins a job as worker rank 1, reads every row of table V (holding their versions), reports
"ready" on stdout and waits to be killed (tests/server/test_holdings.py)."""

from __future__ import annotations

import sys
import time

import numpy as np

from bosen.client import Client

client = Client.connect(sys.argv[1], rank=1)
V = client.table("V")
V.get_rows(np.arange(V.rows))
print("ready", flush=True)
time.sleep(600)
