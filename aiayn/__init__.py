"""The ``aiayn`` command: list, audit and export Transformer implementations."""
