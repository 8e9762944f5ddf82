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

A discovered plugin (built-in, entry point, ``AIAYN_PLUGINS``) that fails to
import, raises in its hook or registers something invalid is reported in one
line naming it, and the other plugins still load; set ``AIAYN_STRICT_PLUGINS=1``
to make that an error (useful while developing a plugin). A plugin passed with
``--plugin`` is an instruction: any such failure stops the run with a one-line
usage error naming it (``aiayn`` exits 2, pytest 4).

Each registration is validated by the host when ``register`` is called (the
name, the output kind, every deviation's clause id and reason) and recorded
with the name of the plugin that made it.
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

        from aiayn_conformance.implementations import Implementation, hookimpl

        @hookimpl
        def register_implementations(register):
            register(Implementation(
                name="my-transformer",            # used as --impl my-transformer
                build=build,                      # ModelConfig -> adapter (torch.nn.Module)
                summary="My Transformer, post-norm, fused attention",
                source="https://github.com/me/my-transformer (model.py at <commit>)",
                output="logits",                  # or "log_probs" / "probs"
                deviations={"norm.post-norm": "pre-norm residuals: x + sublayer(norm(x)) (model.py:42)"},
                notes="optional prose for the audit docs: what is reproduced, what is not a deviation",
            ))

    ``build(config)`` receives a ``spec.ModelConfig`` and returns an adapter
    meeting ``spec.contract`` (``forward(src, tgt)``, and optional methods that
    each unlock more checks).

    ``free_head_dims=True`` says ``build`` honours ``config.d_k`` and
    ``config.d_v`` where they differ from d_model / h (Table 3, row B); left
    False, such a configuration is refused in one line before ``build`` runs.

    ``deviations`` maps clause ids (``spec.CLAUSES``) to the reason the
    implementation departs from them. The suite expects those clauses to fail:
    a declared deviation that no check observes fails the run, so declarations
    cannot go stale silently. An invalid registration (unknown clause id, empty
    reason, bad name or output, a name already registered) is rejected with a
    one-line error naming the plugin; the plugin's other registrations stand.
    """


@hookspec
def register_components(register):
    """Register reusable parts (attention kernels, positional encodings, norms, feed-forwards, the
    decoding parts of §6.1: length penalties and beam searches, and the training parts of §5: optimizers,
    learning-rate schedules and criteria).

    Call ``register`` once per component, with a ``Component(kind, name, factory, summary=...,
    source=..., deviations=...)``. What ``factory`` must return depends on ``kind``:

    ``attention``
        ``factory() -> fn`` with ``fn(q, k, v, mask) -> out``: q [B, h, Lq, d_k],
        k [B, h, Lk, d_k], v [B, h, Lk, d_v]; ``mask`` is None or a boolean tensor
        broadcastable to [B, h, Lq, Lk] where **True means "may attend"**; returns
        [B, h, Lq, d_v] = softmax(q k^T / sqrt(d_k)) v over the allowed keys
        (§3.2.1, Eq. 1). A query with no allowed key returns zeros.
    ``positional_encoding``
        ``factory() -> fn`` with ``fn(length, d_model) -> [length, d_model]``, the
        table added to the scaled embeddings (§3.5).
    ``layer_norm``
        ``factory(d_model, eps) -> nn.Module`` mapping [..., d_model] to the same
        shape, with per-feature parameters ``weight`` and ``bias`` of shape
        [d_model] (so canonical states load into it).
    ``feed_forward``
        ``factory(d_model, d_ff) -> nn.Module`` mapping [..., d_model] to the same
        shape, with ``nn.Linear``-like sub-modules ``w1`` (d_model -> d_ff) and
        ``w2`` (d_ff -> d_model), each with ``weight`` and ``bias``.
    ``length_penalty``
        ``factory() -> fn`` with ``fn(length, alpha) -> lp``: ``length`` is a
        LongTensor of output lengths |Y| (any shape; |Y| counts y_1 .. y_m, the
        end symbol included, the start symbol not) and ``alpha`` a float >= 0;
        ``lp`` is a floating tensor of the same shape, the divisor of a
        hypothesis's summed log-probabilities (§6.1: GNMT's ((5 + |Y|) / 6)^alpha).
    ``search``
        ``factory() -> fn``, a beam search with ``reference.decoding.beam_search``'s
        signature: ``fn(decoder, src, *, bos_id, eos_id, pad_id, beam_size, alpha,
        max_len, length_penalty)``. It drives any step decoder (``begin_decoding``,
        ``decode_step``, ``reorder_state``; ``spec.contract``) over ``src`` [B, S],
        ranks hypotheses with ``length_penalty`` (a ``length_penalty`` component's
        ``fn``) and returns a ``reference.decoding.Hypotheses`` or just its tokens
        [B, L], as ``spec.contract``'s ``generate`` returns them. ``max_len`` is an
        int, a LongTensor [B], or None for §6.1's real source length + 50.
    ``optimizer``
        ``factory(params, train_config) -> torch.optim.Optimizer`` over ``params`` (an
        iterable of parameters); ``train_config`` is a ``spec.TrainConfig`` whose
        defaults are the paper's (§5.3: Adam, beta1 0.9, beta2 0.98, eps 1e-9, no
        weight decay). Its learning rate is the schedule's.
    ``lr_schedule``
        ``factory(optimizer, d_model, train_config) -> scheduler``: any object whose
        ``step()`` is called once after each ``optimizer.step()`` and which sets the
        rate in ``optimizer.param_groups`` (the rate read before update k is the rate
        of update k; §5.3, Eq. (3) with ``train_config.warmup_steps`` for a model of
        width ``d_model``).
    ``criterion``
        ``factory(vocab, pad_id, train_config) -> criterion`` with ``criterion(logits
        [N, vocab], labels [N]) -> scalar loss``; ``labels`` holds ``pad_id`` at padding
        positions (§5.4: label smoothing ``train_config.label_smoothing``, padding
        targets contributing nothing).
    A factory that cannot run here (a CUDA-only kernel on a CPU machine, a library
    it wraps not installed) raises ``implementations.ComponentUnavailable``; its
    checks then skip with that reason.

    Components are audited alone with ``pytest conformance/ --component=NAME``
    (``NAME``, ``KIND:NAME`` or ``all``) and, composed into the reference, as a
    whole model: ``--impl 'reference+attention=NAME'``, which inherits the
    deviations its components declare. docs/components.md says what each kind
    replaces in the composed model.
    """
