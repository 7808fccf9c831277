"""The `shardc` console script the package installs: the same command line as
the Rust binary, run by the native module in this process."""

import sys

from . import _shardc


def main() -> None:
    """Run `shardc ARGS...` and exit with its status."""
    _shardc.cli(["shardc", *sys.argv[1:]])


if __name__ == "__main__":
    main()
