"""The sub-commands beyond ``list``; each module offers ``add_parser(subparsers)``."""

from . import audit, export_cmd, scaffold, train_cmd

MODULES = (audit, export_cmd, train_cmd, scaffold)
