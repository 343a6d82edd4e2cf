"""SCAR's recovery experiments in miniature: rework after failures, full restart vs partial recovery,
priority checkpoints, what checkpoints cost (``python -m bench.recovery``, see ``__main__``).

``runs`` (the jobs and their objective), ``states`` (the baseline's state after every clock) and
``faults`` (what a failure loses and how it is put back) serve the driver and ``spread``, the analysis
of how rows move between checkpoints.
"""
