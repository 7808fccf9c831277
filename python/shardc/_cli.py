"""The `shardc` console script the package installs: the same command line as
the Rust binary, run by the native module in this process."""

import signal
import sys

from . import _shardc


def main() -> None:
    """Run `shardc ARGS...` and exit with its status."""
    # Ctrl-C ends the command as it ends the Rust binary (Python's own handler
    # would only set a flag nobody reads while the command runs).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _shardc.cli(["shardc", *sys.argv[1:]])


if __name__ == "__main__":
    main()
