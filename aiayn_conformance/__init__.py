"""aiayn-conformance: the conformance suite for the Transformer of "Attention Is All You Need".

One installed namespace. The repository keeps the project's parts as top-level folders, installed under this
package (pyproject.toml's ``package-dir``):

=====================================  ===================================================================
``aiayn_conformance.spec``             ``spec/``: the paper as data (configs, clauses, schema, contract)
``aiayn_conformance.reference``        ``reference/``: the reference Transformer, its decoding and training
``aiayn_conformance.implementations``  ``implementations/``: the plugin registry and the built-in plugins
``aiayn_conformance.conformance``      ``conformance/``: the pytest suite
``aiayn_conformance.export``           ``export/``: ONNX and CTranslate2 export
``aiayn_conformance`` (this package)   ``aiayn_conformance/``: the ``aiayn`` command
=====================================  ===================================================================

The top-level names of release 0.1 (``spec``, ``reference``, ``implementations``, ``conformance``, ``export``,
``aiayn``) still import, with a ``DeprecationWarning`` naming the new import, until release 0.3
(``aiayn_conformance._compat``).
"""

from ._compat import install as _install_old_names

__version__ = "0.2.0"

_install_old_names()
