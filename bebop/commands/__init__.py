"""The jobs behind `bebop COMMAND` (see bebop/cli.py): each a module with `add_arguments` and `run`."""
