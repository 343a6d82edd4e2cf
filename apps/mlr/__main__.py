"""``python -m bosen.apps.mlr``: one MLR worker process (``bosen launch`` starts K of them)."""

from bosen.apps.runner import run_app

from .worker import train


def main() -> None:
    run_app(train)


if __name__ == "__main__":
    main()
