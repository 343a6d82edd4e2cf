"""The Bösen evaluation in miniature: BS vs managed communication vs BS-k per app, and AdaRevision,
as real jobs (``python -m bench.convergence``, see ``__main__``). ``curves`` turns a job's metrics into
per-epoch curves, ``figures`` draws them, ``shaped_link`` runs the bench behind a rate-limited link."""
