"""The hooks a plugin implements. These docstrings are the plugin author's documentation.

A plugin is a module (or any object) with functions decorated by
``implementations.hookimpl``. It is found in one of four ways:

* shipped with aiayn-conformance (the built-ins, ``implementations.DEFAULT_PLUGINS``);
* installed, declaring an entry point in the ``aiayn`` group::

      [project.entry-points.aiayn]
      my-transformer = "my_package.aiayn_plugin"

* named in the ``AIAYN_PLUGINS`` environment variable (comma-separated module
  names or paths to ``.py`` files);
* passed as ``--plugin MODULE_OR_PATH`` to ``pytest conformance/`` or ``aiayn``.

A plugin that fails to import or to register is reported in one line naming
it; the other plugins still load. Set ``AIAYN_STRICT_PLUGINS=1`` to raise
instead (useful while developing a plugin).
"""

from __future__ import annotations

import pluggy

PROJECT = "aiayn"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_implementations(register):
    """Register whole-model implementations to audit.

    Call ``register`` once per implementation, with an ``Implementation``::

        from implementations import Implementation, hookimpl

        @hookimpl
        def register_implementations(register):
            register(Implementation(
                name="my-transformer",            # used as --impl my-transformer
                build=build,                      # ModelConfig -> adapter (torch.nn.Module)
                summary="My Transformer, post-norm, fused attention",
                source="https://github.com/me/my-transformer",
                output="logits",                  # or "log_probs" / "probs"
                deviations={"norm.post-norm": "pre-norm residuals (model.py line 42)"},
            ))

    ``build(config)`` receives a ``spec.ModelConfig`` and returns an adapter
    meeting ``spec.contract``: ``forward(src, tgt)`` with token ids [B, S] and
    [B, T] (right-padded with ``config.pad_id``) returning [B, T, tgt_vocab];
    optionally ``encode``, ``positional_encoding`` and ``load_reference_state``
    (each unlocks more checks).

    ``deviations`` maps clause ids (``spec.CLAUSES``) to the reason the
    implementation departs from them. The suite expects exactly those clauses
    to fail (strict xfail): a declared deviation that is not observed fails
    the run, so declarations cannot go stale silently. An unknown clause id
    or a duplicate name is rejected with a one-line error naming the plugin.
    """


@hookspec
def register_components(register):
    """Register reusable parts (attention kernels, positional encodings, norms, feed-forwards).

    Call ``register`` once per component, with a ``Component``. See
    ``implementations.components`` for the call contract of each kind.
    """
