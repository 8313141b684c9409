"""`python -m blocklab.cli ...`: the `blocklab` command, as `python -m blocklab`."""

from blocklab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
