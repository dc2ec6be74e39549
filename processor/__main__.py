"""``python -m processor``: the command line, as the ``processor`` console script."""

from processor.cli import main

if __name__ == "__main__":
    main()
