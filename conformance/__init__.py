"""The conformance suite: ``pytest conformance/ --impl=NAME``. See conformance/plugin.py for options."""
