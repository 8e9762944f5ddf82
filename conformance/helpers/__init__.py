"""What the checks share, one module per concern; the checks themselves are ``conformance/test_<area>.py``."""
