"""`python -m transformer_cli` works like `tcli` (and under torchrun)."""

from transformer_cli.core.console import guard_closed_streams
from transformer_cli.runtime.malloc import restart_with_mimalloc


def entry() -> None:
    """The `tcli` command: the process starts itself again under mimalloc where it is installed (malloc.py:
    resident memory that stays flat), before anything heavy is imported; then the app runs."""
    guard_closed_streams()
    restart_with_mimalloc()
    from transformer_cli.cli import main

    main()


if __name__ == "__main__":
    entry()
