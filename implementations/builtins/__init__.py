"""The built-in plugins: shipped with aiayn-conformance, registered through the same hooks as any third party's.

Each module here is one plugin (one implementation, or the built-in components), written against the public
interface only (``aiayn_conformance.implementations``: ``hookimpl``, ``Implementation``, ``Component``), one file
per model. ``PLUGINS`` lists them in registration order; the registry loads them first
(``aiayn_conformance.implementations.DEFAULT_PLUGINS``). ``hf_seq2seq`` and ``hf_decoding`` are not plugins: they
are the adapter skeleton and the decoding code the Hugging Face plugins share.

A built-in that needs a layer above this one lives there and registers through the project's own ``aiayn``
entry point (pyproject.toml): ``onnxruntime-cached`` is ``export/onnxruntime_cached.py``, beside the export code it
wraps. The registry loads the project's entry points with the built-ins, so no module here names a layer above.

Adding a built-in: a module here, its name in ``PLUGINS``, and what docs/plugins.md ("Adding a built-in") lists;
the project's tests read the built-ins' names from the registry.
"""

PLUGINS: tuple[str, ...] = (
    "reference", "building_blocks", "sections_notebook", "annotated_notebook", "jadore801120", "hyunwoongko",
    "torch_nn", "prenorm", "fused", "hf_marian", "hf_fsmt", "hf_bart", "x_transformers", "components",
    "tk_opennmt", "tk_opennmt_defaults", "tk_joeynmt", "tk_joeynmt_defaults", "tk_fairseq", "tk_fairseq_defaults",
    "tk_sockeye", "tk_sockeye_defaults",
)
"""The built-in plugin modules of this package, in registration order."""


def module_name(plugin: str) -> str:
    """The import name of an entry of ``PLUGINS`` (``"fused"`` -> ``aiayn_conformance...builtins.fused``)."""
    return plugin if "." in plugin else f"{__name__}.{plugin}"
