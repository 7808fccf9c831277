"""`python -m shardc ARGS...`: the command line."""

from ._cli import main

main()
