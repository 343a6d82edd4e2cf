"""How fast are the app kernels beside the strongest libraries at equal quality, and what does a job
add to the bare kernel? ``python -m bench.apps`` runs ``lda``, ``mf`` and ``mlr`` (one module each);
``python -m bench.apps.readers`` times the data readers."""
