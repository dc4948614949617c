"""`python -m transformer_cli` works like `tcli` (and under torchrun)."""

from transformer_cli.cli import main

if __name__ == "__main__":
    main()
