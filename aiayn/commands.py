"""The sub-commands beyond ``list``; each module offers ``add_parser(subparsers)``."""

from . import audit

MODULES = (audit,)
