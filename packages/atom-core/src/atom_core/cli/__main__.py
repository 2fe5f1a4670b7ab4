"""python -m atom_core.cli: the `atom` command."""

from atom_core.cli import run_program

run_program()
