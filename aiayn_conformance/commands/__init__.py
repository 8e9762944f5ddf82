"""The sub-commands beyond ``list``; each module offers ``add_parser(subparsers)``."""

from aiayn_conformance import audit, scaffold

from . import export, install, train

MODULES = (audit, export, train, scaffold, install)
