"""The conformance suite: ``pytest conformance/ --impl=NAME``. The checks are ``test_<area>.py``; the pytest hooks
``plugin.py``; what the checks share ``helpers/``."""
