"""``python -m bosen.apps.mf``: one MF worker process (``bosen launch`` starts K of them)."""

from bosen.apps.mf.worker import prepare, train
from bosen.apps.runner import run_app

if __name__ == "__main__":
    run_app(train, prepare=prepare)
