# Loads the suite's options when pytest runs from a checkout; the installed
# package registers the same module through its pytest11 entry point.
pytest_plugins = ["aiayn_conformance.conformance.plugin", "pytester"]
