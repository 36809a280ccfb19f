"""The ``hvd-elastic`` subcommands, one module each, named after the command.

Each module reads its flags and the environment (``add_arguments``), turns
bad input into one line and exit 2, and runs its role with typed values
(``run``, which returns the exit code); the roles themselves live in their
packages and never import a command.  :mod:`hvd_elastic.cli` is the registry;
:mod:`hvd_elastic.entry` answers ``discover``'s warm path and ``exec`` before
loading it.  This package imports nothing: ``exec`` starts every worker.
"""
