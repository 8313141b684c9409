"""`python -m blocklab ...`: the `blocklab` command, for an environment whose scripts folder is not on
PATH; it exits with the command's status (0 done, 1 failed, 2 bad input, 130 interrupted)."""

from blocklab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
