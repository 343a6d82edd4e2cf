"""``python -m bosen.apps.lda``: one LDA worker process (``bosen launch`` starts K of them)."""

from bosen.apps.lda.worker import prepare, train
from bosen.apps.runner import run_app

if __name__ == "__main__":
    run_app(train, prepare=prepare)
