"""The plugins that wrap installed libraries (hf-marian, hf-fsmt, hf-bart, x-transformers).

1. Each transplant is right: with the library configured as far toward the paper as it goes and the departures
   it cannot be configured out of neutralised here (the positional table replaced by §3.5's, the embedding
   norms made identities, ...), the adapter holding the canonical weights computes the reference's outputs.
   So the deviations the suite reports are the library's, not the adapter's. Each test also shows that without
   the neutralisation the outputs differ (the departure is real and reaches the output).
2. Every file:line a declaration cites is recorded in the plugin's ``CITED`` with a fragment of that line, and
   matches the installed source when the installed version is the one the declarations were written for.
"""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path

import pytest
import torch
from registered import library_module, library_plugins
from toolkit_witness import CONFIGS, batch

from aiayn_conformance.conformance.helpers.transplant import reference_twin, visible_state
from aiayn_conformance.implementations.availability import installed_version, parse_written_for, version_note
from aiayn_conformance.reference.model import sinusoid_table
from aiayn_conformance.spec.config import TINY, ModelConfig
from aiayn_conformance.spec.tolerance import compare

PLUGINS = library_plugins()  # name -> plugin module, read from the registry


def adapter(name: str, cfg: ModelConfig):
    pytest.importorskip(library_module(name))
    return importlib.import_module(PLUGINS[name]).build(cfg).eval()


def set_norm_eps(model: torch.nn.Module, eps: float) -> None:
    """The libraries' layer norms are torch.nn.LayerNorm(d_model) with eps 1e-5: give them the config's."""
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = eps


def assert_same(adapted, ref, cfg: ModelConfig, *, same: bool = True) -> None:
    """``adapted`` computes the reference's outputs at real target positions and its ``encode`` at real source
    positions (``same``), or differs from them (``same=False``)."""
    src, tgt = batch(cfg)
    with torch.no_grad():
        out, expected = adapted(src, tgt), ref(src, tgt)
        real = tgt != cfg.pad_id
        cmp = compare(out[real].double(), expected[real].double(), dtype=torch.float32, scope="model")
        if not same:
            assert not cmp.ok, "the neutralised departure does not reach the output: the test proves nothing"
            return
        assert cmp.ok, f"outputs differ from the reference: {cmp.describe()}"
        keep = src != cfg.pad_id
        enc = compare(adapted.encode(src)[keep].double(), ref.encode(src)[keep].double(), dtype=torch.float32,
                      scope="model")
        assert enc.ok, f"encode() differs from the reference's: {enc.describe()}"


def loaded(name: str, cfg: ModelConfig, **state_options):
    model = adapter(name, cfg)
    state = visible_state(cfg, seed=5, **state_options)
    model.load_reference_state(state)
    return model, reference_twin(cfg, state)


# -- 1. transplant proofs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", list(CONFIGS))
def test_marian_transplant(which):
    cfg = CONFIGS[which]
    model, ref = loaded("hf-marian", cfg)
    assert_same(model, ref, cfg, same=False)  # the half-sin/half-cos table is Marian's departure
    with torch.no_grad():
        for stack in (model.model.model.encoder, model.model.model.decoder):
            stack.embed_positions.weight.copy_(sinusoid_table(cfg.max_len, cfg.d_model))
    set_norm_eps(model, cfg.norm_eps)
    assert_same(model, ref, cfg)


@pytest.mark.parametrize("which", list(CONFIGS))
def test_fsmt_transplant(which):
    cfg = CONFIGS[which]
    model, ref = loaded("hf-fsmt", cfg)
    with torch.no_grad():  # fairseq's table, positions from pad_id + 1: there, the paper's rows
        for stack in (model.model.model.encoder, model.model.model.decoder):
            table = stack.embed_positions.weight
            table[cfg.pad_id + 1:].copy_(sinusoid_table(table.size(0) - cfg.pad_id - 1, cfg.d_model))
    set_norm_eps(model, cfg.norm_eps)
    assert_same(model, ref, cfg)  # the training path (use_cache=False): forward builds the masks


def test_fsmt_default_use_cache_forward_reads_the_future():
    """The bug hf-fsmt's notes record: the same call with the model's default use_cache=True builds no causal
    mask, so a target position's output changes when a later target token does (the adapter's training path
    does not)."""
    cfg = CONFIGS["tied"]
    model, _ = loaded("hf-fsmt", cfg)
    src, tgt = batch(cfg)
    later = tgt.clone()
    later[1, -1] = 9 if int(tgt[1, -1]) != 9 else 10  # only the last token of row 1 changes

    def first_positions(use_cache: bool | None) -> torch.Tensor:
        keep = (src != cfg.pad_id).long()
        outs = [model.model(input_ids=src, attention_mask=keep, decoder_input_ids=t,
                            decoder_attention_mask=(t != cfg.pad_id).long(), use_cache=use_cache).logits[1, :-1]
                for t in (tgt, later)]
        return (outs[0] - outs[1]).abs().max()

    with torch.no_grad():
        assert first_positions(None) > 1e-3, "the default call is causal: the note is stale"
        assert first_positions(False) < 1e-6
        changed = (model(src, tgt)[1, :-1] - model(src, later)[1, :-1]).abs().max()
    assert changed < 1e-6, f"the adapter's forward reads a later target token (by {changed:.3g})"


@pytest.mark.parametrize("which", ["tied", "pad-3"])
def test_bart_transplant(which):
    cfg = CONFIGS[which]
    model, ref = loaded("hf-bart", cfg)
    set_norm_eps(model, cfg.norm_eps)
    assert_same(model, ref, cfg, same=False)  # the embedding LayerNorms are BART's departure
    for stack in (model.model.model.encoder, model.model.model.decoder):
        stack.layernorm_embedding = torch.nn.Identity()
    assert_same(model, ref, cfg)


def test_bart_untied_with_one_vocabulary_and_one_line_refusal_otherwise():
    cfg = CONFIGS["tied"].replace(share_embeddings=False)
    model, ref = loaded("hf-bart", cfg)
    set_norm_eps(model, cfg.norm_eps)
    for stack in (model.model.model.encoder, model.model.model.decoder):
        stack.layernorm_embedding = torch.nn.Identity()
    assert_same(model, ref, cfg)
    with pytest.raises(ValueError, match=r"hf-bart cannot build src_vocab=41 != tgt_vocab=43: BartConfig has one "
                                         r"vocab_size"):
        adapter("hf-bart", CONFIGS["untied"])


class PaperTable(torch.nn.Module):
    """§3.5's table in x-transformers' positional-embedding call signature."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model

    def forward(self, x, pos=None, seq_start_pos=None, offset=0):
        return sinusoid_table(offset + x.shape[1], self.d_model, device=x.device)[offset:]


@pytest.mark.parametrize("which", list(CONFIGS))
def test_x_transformers_transplant(which):
    cfg = CONFIGS[which]
    # x-transformers' LayerNorm has no bias: the reference gets none either.
    model, ref = loaded("x-transformers", cfg, adjust=lambda n, t: torch.zeros_like(t)
                        if ".norm" in n and n.endswith(".bias") else t)
    set_norm_eps(model, cfg.norm_eps)
    assert_same(model, ref, cfg, same=False)  # unscaled embeddings, scaled half-and-half sinusoids
    xt = model.model
    with torch.no_grad():
        embeddings = {id(w.token_emb): w.token_emb for w in (xt.encoder, xt.decoder.net)}  # one when tied
        for emb in embeddings.values():
            emb.emb.weight.mul_(math.sqrt(cfg.d_model))  # the paper's sqrt(d_model), on the inputs only
    for wrapper in (xt.encoder, xt.decoder.net):
        wrapper.pos_emb = PaperTable(cfg.d_model)
    assert_same(model, ref, cfg)


def test_x_transformers_drops_the_canonical_norm_biases_and_nothing_else():
    """The only canonical tensors x-transformers cannot hold are the layer-norm biases."""
    cfg = CONFIGS["tied"]
    with_bias, ref = loaded("x-transformers", cfg)
    set_norm_eps(with_bias, cfg.norm_eps)
    for wrapper in (with_bias.model.encoder, with_bias.model.decoder.net):
        wrapper.pos_emb = PaperTable(cfg.d_model)
    with torch.no_grad():
        with_bias.model.encoder.token_emb.emb.weight.mul_(math.sqrt(cfg.d_model))
    assert_same(with_bias, ref, cfg, same=False)


@pytest.mark.parametrize("name", list(PLUGINS))
def test_loading_twice_gives_the_same_model(name):
    """load_reference_state sets every parameter it touches (no state left over from the first load)."""
    cfg = CONFIGS["tied"]
    model = adapter(name, cfg)
    model.load_reference_state(visible_state(cfg, seed=1))
    model.load_reference_state(visible_state(cfg, seed=2))
    twin = adapter(name, cfg)
    twin.load_reference_state(visible_state(cfg, seed=2))
    src, tgt = batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), twin(src, tgt))


# -- decoding: the library's own cache and generate behind the contract's methods ----------------------------
HF = ["hf-marian", "hf-fsmt", "hf-bart"]


def step_scores(model, src: torch.Tensor, tokens: torch.Tensor, reorder: torch.Tensor) -> list[torch.Tensor]:
    """Log-probabilities of begin_decoding/decode_step over ``tokens`` (steps, N), rows expanded by ``reorder``."""
    state = model.reorder_state(model.begin_decoding(src), reorder)
    out = []
    with torch.no_grad():
        for t in range(tokens.size(0)):
            scores, state = model.decode_step(state, tokens[t])
            out.append(scores.double().log_softmax(-1))
    return out


def assert_steps_match_forward(model, cfg: ModelConfig) -> None:
    src, _ = batch(cfg)
    rows = torch.tensor([0, 0, 1, 2, 2])  # sources expanded as beam search expands them
    tokens = torch.randint(3, cfg.tgt_vocab, (5, len(rows)), generator=torch.Generator().manual_seed(3))
    got = step_scores(model, src, tokens, rows)
    worst = 0.0
    with torch.no_grad():
        for t, scores in enumerate(got):
            full = model(src[rows], tokens[:t + 1].T)[:, -1].double().log_softmax(-1)
            worst = max(worst, (scores - full).abs().max().item())
    assert worst < 1e-4, f"the cached steps differ from the full forward by {worst:.3g}"


@pytest.mark.parametrize("name", HF)
def test_hf_cached_steps_equal_the_full_forward(name):
    """The library's cache, driven by the adapter, computes what the full forward computes on every prefix (FSMT's
    forward is its training path, use_cache=False: with the default use_cache=True they would differ)."""
    cfg = CONFIGS["pad-3"]
    model, _ = loaded(name, cfg)
    assert_steps_match_forward(model, cfg)


@pytest.mark.parametrize("name", HF)
def test_hf_greedy_generate_is_the_reference_greedy_search_on_the_same_model(name):
    """generate(beam_size=1) returns what the reference greedy search returns driving the adapter's own cached
    decoder: the start symbol dropped, finished rows padded, the padding id never generated."""
    from aiayn_conformance.reference.decoding import greedy_search, search_tokens

    cfg = CONFIGS["pad-3"]
    model, _ = loaded(name, cfg, adjust=lambda n, t: t * 3 if "embed" in n or n.startswith("generator") else t)
    src, _ = batch(cfg)
    for eos in range(4, 12):
        expected = search_tokens(greedy_search(model, src, bos_id=1, eos_id=eos, pad_id=cfg.pad_id, max_len=6))
        got = model.generate(src, bos_id=1, eos_id=eos, beam_size=1, alpha=0.6, max_len=6)
        width = max(expected.size(1), got.size(1))
        pad = torch.nn.functional.pad
        assert torch.equal(pad(got, (0, width - got.size(1)), value=cfg.pad_id),
                           pad(expected, (0, width - expected.size(1)), value=cfg.pad_id)), (eos, got, expected)


def varied_outputs(name: str, t: torch.Tensor) -> torch.Tensor:
    """Sharpened embeddings, and sub-layers outputting several times their residual input (the visible weights'
    output maps x4 and x2): the outputs vary from step to step and some beams end before the limit (with the
    visible weights as drawn, each output mostly repeats its input token)."""
    if "embed" in name or name.startswith("generator"):
        return t * 3
    factor = {"attn.o.weight": 4.0, "attn.v.weight": 2.0, "ffn.w2.weight": 2.0}
    return next((t * f for end, f in factor.items() if name.endswith(end)), t)


def test_hf_beam_fills_finished_rows_with_the_end_symbol_only_when_the_pad_id_is_0():
    """The end-symbol filling that hf-*'s notes record is transformers' (`pad_token_id or eos`), not the
    adapter's: the same call pads with a pad id of 3 and repeats the end symbol with a pad id of 0."""
    for pad_id, fill in ((3, "pad"), (0, "eos")):
        cfg = TINY.replace(dropout=0.0, pad_id=pad_id)
        model, _ = loaded("hf-marian", cfg, adjust=varied_outputs)
        src, _ = batch(cfg)
        finished = []
        for eos in range(4, 20):
            out = model.generate(src, bos_id=1, eos_id=eos, beam_size=4, alpha=0.6, max_len=8)
            finished += [row[row.tolist().index(eos) + 1:] for row in out if eos in row[:-1].tolist()]
        assert finished, "no beam finished before the limit: the test proves nothing"
        want = pad_id if fill == "pad" else None
        for tail in finished:
            eos_of_row = None if want is not None else tail[0].item()
            assert (tail == (want if want is not None else eos_of_row)).all(), (pad_id, tail)


# -- 2. declarations tied to the version they were written for ----------------------------------------------
CITATION = re.compile(r"(?:([\w/]+\.py))?:(\d+)(?:-(\d+))?")


def citations(module) -> set[str]:
    """Every ``path.py:N`` (and ``:N`` after a path, and both ends of ``:N-M``) in the deviations (declared, and
    known but not yet seen by the suite: ``UNSEEN``) and notes."""
    found: set[str] = set()
    for text in [*module.DEVIATIONS.values(), *getattr(module, "UNSEEN", {}).values(), module.NOTES]:
        path = None
        for m in CITATION.finditer(text):
            path = m.group(1) or path
            if path is None:
                continue
            found |= {f"{path}:{n}" for n in (m.group(2), m.group(3)) if n}
    return found


@pytest.mark.parametrize("name", list(PLUGINS))
def test_every_citation_is_recorded_with_its_line(name):
    module = importlib.import_module(PLUGINS[name])
    cited = citations(module)
    assert cited, f"{name} cites no source line"
    assert cited <= set(module.CITED), f"{name}: cited but not in CITED: {sorted(cited - set(module.CITED))}"
    assert set(module.CITED) <= cited, f"{name}: CITED lists lines no reason cites: {sorted(set(module.CITED) - cited)}"


@pytest.mark.parametrize("name", list(PLUGINS))
def test_cited_lines_match_the_installed_source_of_the_version_written_for(name):
    module = importlib.import_module(PLUGINS[name])
    distribution, version = parse_written_for(module.WRITTEN_FOR)
    installed = installed_version(distribution)
    if installed is None:
        pytest.skip(f"{distribution} is not installed")
    if installed != version:
        pytest.skip(f"{version_note(module.WRITTEN_FOR)}: the cited lines describe {version}")
    package = importlib.util.find_spec(library_module(name))
    assert package is not None and package.origin is not None
    site = Path(package.origin).parent.parent
    wrong = []
    for where, fragment in module.CITED.items():
        path, line = where.rsplit(":", 1)
        lines = (site / path).read_text().splitlines()
        if fragment not in lines[int(line) - 1]:
            wrong.append(f"{where}: expected {fragment!r}, found {lines[int(line) - 1].strip()!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", list(PLUGINS))
def test_unseen_departures_are_known_clauses_not_declared(name):
    """``UNSEEN`` (real departures the suite does not observe yet) names catalogue clauses, none also declared."""
    from aiayn_conformance.spec.clauses import CLAUSES

    unseen = getattr(importlib.import_module(PLUGINS[name]), "UNSEEN", {})
    assert set(unseen) <= set(CLAUSES), sorted(set(unseen) - set(CLAUSES))
    assert not set(unseen) & set(importlib.import_module(PLUGINS[name]).DEVIATIONS)


@pytest.mark.parametrize("name", list(PLUGINS))
def test_the_registration_records_the_version(name):
    from aiayn_conformance.implementations import get_registry

    impl = get_registry().get(name)
    module = importlib.import_module(PLUGINS[name])
    assert impl.written_for == module.WRITTEN_FOR and dict(impl.deviations) == module.DEVIATIONS
    for why in impl.deviations.values():
        assert re.search(r"\.py:\d+", why), f"{name}: a reason cites no source line: {why}"
