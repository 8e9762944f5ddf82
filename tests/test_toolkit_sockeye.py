"""The built-in plugins ``sockeye`` and ``sockeye-defaults`` (implementations/builtins/tk_sockeye.py).

1. The transplant is right: ``sockeye`` holding the canonical weights computes the reference's outputs once §3.5's
   interleaved table replaces its positional table (two halves, the departure it cannot be configured out of), and
   differs without that; ``sockeye-defaults`` computes them once its blocks are also made post-norm without final
   norms, and not before. The key/value layouts survive train/eval switches and state-dict round trips.
2. Decoding runs through Sockeye's own code: its decoding step equals the full forward, ``generate(beam_size=1)`` is
   its BeamSearch of width 1 with </s> forced at the limit, and its scheduler is stepped before each update (all
   declared or noted).
3. Every cited line matches the installed release; the install command is what ``aiayn list`` shows without it.
4. A model directory saved by ``python -m sockeye.train`` (3 updates on tests/fixtures/toolkits/sockeye) is read with
   its config, vocabularies and args.yaml and audited as saved: each clause judged on its weights gets the built-in's
   verdict at its sizes; a file of another kind is refused in one line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("sockeye")

from toolkit_witness import CONFIGS, agree, batch, loaded  # noqa: E402

from aiayn_conformance.conformance.helpers.transplant import visible_state  # noqa: E402
from aiayn_conformance.implementations import get_registry  # noqa: E402
from aiayn_conformance.implementations.builtins import tk_sockeye as tk  # noqa: E402
from aiayn_conformance.implementations.builtins import tk_sockeye_defaults as tkd  # noqa: E402
from aiayn_conformance.implementations.builtins.tk_citations import cited  # noqa: E402
from aiayn_conformance.reference.model import sinusoid_table  # noqa: E402
from aiayn_conformance.spec.config import ModelConfig  # noqa: E402
from aiayn_conformance.spec.training import TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "toolkits" / "sockeye"


def interleaved_tables(model: tk.SockeyeAdapter) -> None:
    """Both stacks' positional tables replaced by §3.5's (sines on even, cosines on odd dimensions)."""
    with torch.no_grad():
        for pos in (model.model.encoder.pos_embedding, model.model.decoder.pos_embedding):
            pos.weight.copy_(sinusoid_table(pos.weight.size(0), pos.weight.size(1)))


# -- 1. transplant ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", list(CONFIGS))
def test_sockeye_holding_canonical_weights_is_the_reference_but_for_its_table(which):
    cfg = CONFIGS[which]
    model, ref = loaded(tk.build_paper, cfg)
    assert not agree(model, ref, cfg), "the table in two halves should change the outputs"
    interleaved_tables(model)
    assert agree(model, ref, cfg), "sockeye with canonical weights and §3.5's table is not the reference"
    with torch.no_grad():  # the output bias the paper lacks: set, it reaches the output
        model.model.output_layer.bias[5] = 3.0
    assert not agree(model, ref, cfg)


def test_the_mapping_and_the_layouts_are_what_makes_it_agree():
    """Each line of the mapping matters (norms swapped), and the key/value layouts survive train/eval switches and
    state-dict round trips in either mode (the saved layout is the interleaved one)."""
    cfg = CONFIGS["pad-3"]
    model, ref = loaded(tk.build_paper, cfg)
    interleaved_tables(model)
    model.train()
    model.eval()
    assert agree(model, ref, cfg)
    for mode in (True, False):
        other = tk.build_paper(cfg).train(mode)
        other.load_state_dict(model.state_dict())
        assert agree(other.eval(), ref, cfg), f"a state dict loaded in {'train' if mode else 'eval'} mode"
    saved = model.state_dict()["model.encoder.layers.0.self_attention.ff_in.weight"].clone()
    model.train()
    assert torch.equal(model.state_dict()["model.encoder.layers.0.self_attention.ff_in.weight"], saved)
    state = visible_state(cfg, seed=5)
    swapped = {**state, "encoder.0.norm1.weight": state["encoder.0.norm2.weight"],
               "encoder.0.norm2.weight": state["encoder.0.norm1.weight"]}
    wrong = tk.build_paper(cfg).eval()
    wrong.load_reference_state(swapped)
    interleaved_tables(wrong)
    assert not agree(wrong, ref, cfg)


def test_defaults_are_the_paper_model_with_pre_norm_blocks_and_final_norms():
    cfg = CONFIGS["tied"]
    model, ref = loaded(tk.build_defaults, cfg)
    interleaved_tables(model)
    assert not agree(model, ref, cfg)
    for stack, subs in ((model.model.encoder, ("self_attention", "ff")),
                        (model.model.decoder, ("autoregr_layer", "enc_attention", "ff"))):
        for layer in stack.layers:  # each pre-block's norm (holding normK) moved after the residual: ''/'drn'
            for sub in subs:
                pre, post = getattr(layer, f"pre_{sub}"), getattr(layer, f"post_{sub}")
                post.layer_norm, post.sequence, pre.sequence = pre.layer_norm, "drn", ""
        stack.final_process.sequence = ""
    assert agree(model, ref, cfg), "post-norm without final norms, the defaults are not the paper's model"


# -- 2. decoding and recipe through the toolkit -------------------------------------------------------------------
def test_decoding_steps_equal_the_full_forward():
    cfg = CONFIGS["pad-3"]
    model, _ = loaded(tk.build_paper, cfg, seed=3)
    src, _ = batch(cfg)
    rows = torch.tensor([0, 0, 1, 2, 2])
    tokens = torch.randint(4, cfg.tgt_vocab, (5, len(rows)), generator=torch.Generator().manual_seed(3))
    state = model.reorder_state(model.begin_decoding(src), rows)
    worst = 0.0
    with torch.no_grad():
        for t in range(tokens.size(0)):
            scores, state = model.decode_step(state, tokens[t])
            full = model(src[rows], tokens[:t + 1].T)[:, -1]
            worst = max(worst, (scores.log_softmax(-1) - full.log_softmax(-1)).abs().max().item())
    assert worst < 1e-4, f"the decoding steps differ from the full forward by {worst:.3g}"


def test_greedy_is_its_beam_search_of_width_one_with_the_end_symbol_forced_at_the_limit():
    """generate(beam_size=1) is the argmax trajectory of the adapter's own steps (<pad> and the start symbol not
    excluded; <pad> ends an output), cut at max_len tokens, the last of which is </s> when the limit is reached
    (decode.greedy's reason)."""
    cfg = CONFIGS["untied"]
    model, _ = loaded(tk.build_paper, cfg, seed=4)
    src, _ = batch(cfg)
    limit = 6
    for eos in (2, 5, 9):
        got = model.generate(src, bos_id=1, eos_id=eos, beam_size=1, alpha=0.6, max_len=limit)
        state, tok, want = model.begin_decoding(src), torch.full((src.size(0),), 1), []
        with torch.no_grad():
            for _ in range(limit):
                scores, state = model.decode_step(state, tok)
                tok = scores.argmax(-1)
                want.append(tok)
        for i, row in enumerate(torch.stack(want, 1).tolist()):
            stop = next((k for k, t in enumerate(row) if t in (eos, cfg.pad_id)), None)
            if stop is None:
                row = row[:limit - 1] + [eos]  # forced at the limit
            else:
                row = row[:stop + 1] if row[stop] == eos else row[:stop]
            out = [t for t in got[i].tolist()][:len(row)]
            assert out == row and all(t == cfg.pad_id for t in got[i, len(row):].tolist()), (eos, i, got, row)


def test_the_scheduler_is_stepped_before_each_update():
    """train.lr-schedule passes: inv-sqrt-decay with base d_model^-0.5, stepped before each update as its trainer
    does, runs update k at Eq. (3)'s step k."""
    cfg = CONFIGS["tied"]
    model = tk.build_paper(cfg)
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = model.make_optimizer([param], TrainConfig())
    scheduler = model.make_scheduler(optimizer, TrainConfig())

    def eq3(k: int) -> float:
        return cfg.d_model ** -0.5 * min(k ** -0.5, k * 4000 ** -1.5)

    rates = []
    for _ in range(4):
        rates.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    assert rates == pytest.approx([eq3(1), eq3(2), eq3(3), eq3(4)])
    defaults = tk.build_defaults(cfg)
    optimizer = defaults.make_optimizer([param], TrainConfig())
    scheduler = defaults.make_scheduler(optimizer, TrainConfig())
    for _ in range(3):
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0002)  # plateau-reduce: no validation, no change


def test_the_criterion_ignores_the_audit_padding_at_any_id():
    cfg = CONFIGS["pad-3"]
    criterion = tk.build_paper(cfg).make_criterion(TrainConfig())
    scores = torch.randn(6, cfg.tgt_vocab, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([4, 5, 6, 7, 3, 3])
    whole = criterion(scores, labels)
    assert whole == pytest.approx(criterion(scores[:4], labels[:4]).item())
    smooth = -(0.9 * scores[:4].log_softmax(-1)[torch.arange(4), labels[:4]]
               + 0.1 / cfg.tgt_vocab * scores[:4].log_softmax(-1).sum(-1)).mean()
    assert whole == pytest.approx(smooth.item(), rel=1e-5)


# -- 3. declarations and install ----------------------------------------------------------------------------------
def test_every_citation_has_its_line_and_matches_the_installed_release():
    """Each registration's CITED is what its reasons and notes cite, every line of the table is cited by one of
    them, and each fragment is on its line in the installed release."""
    for module in (tk, tkd):
        texts = [*module.DEVIATIONS.values(), *getattr(module, "UNSEEN", {}).values(), module.NOTES]
        assert module.CITED == cited(tk.LINES, texts, "sockeye/") and module.CITED, module.__name__
        assert all(re.search(r"\.py:\d+", why) for why in module.DEVIATIONS.values())
    assert set(tk.CITED) | set(tkd.CITED) == set(tk.LINES), sorted(set(tk.LINES) - set(tk.CITED) - set(tkd.CITED))
    from importlib import metadata

    if metadata.version("sockeye") != tk.WRITTEN_FOR.split()[1]:
        pytest.skip("another release is installed")
    site = Path(importlib.util.find_spec("sockeye").origin).parent.parent
    wrong = []
    for where, fragment in tk.LINES.items():
        path, line = where.rsplit(":", 1)
        text = (site / path).read_text().splitlines()[int(line) - 1]
        if fragment not in text:
            wrong.append(f"{where}: expected {fragment!r}, found {text.strip()!r}")
    assert not wrong, "\n".join(wrong)


def test_registrations_and_the_install_command_when_missing(monkeypatch):
    registry = get_registry()
    for name, deviations in (("sockeye", tk.DEVIATIONS), ("sockeye-defaults", tkd.DEVIATIONS)):
        impl = registry.get(name)
        assert impl.written_for == tk.WRITTEN_FOR and dict(impl.deviations) == deviations and not impl.unavailable
        assert impl.read_checkpoint is tk.read_checkpoint and impl.install == tk.INSTALL
    assert "pip install --no-deps sockeye==3.1.34" in tk.INSTALL
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sockeye" else real(name, *a))
    reason = tk.sockeye_unavailable()
    assert reason.startswith("sockeye is not installed") and tk.INSTALL in reason


# -- 4. a model directory as sockeye-train saves it ---------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """`python -m sockeye.train --config train.yaml` (3 updates) on the fixture corpus: the params file it saves in
    its model directory."""
    work = tmp_path_factory.mktemp("sockeye")
    for f in FIXTURE.iterdir():
        shutil.copy(f, work / f.name)
    res = subprocess.run([sys.executable, "-m", "sockeye.train", "--config", "train.yaml"], cwd=work,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return work / "run" / "params.best"


@pytest.mark.slow  # it pays for the module's training run, which the slow checkpoint audit shares
def test_the_checkpoint_gives_its_sizes_options_and_weights(trained):
    ck = tk.read_checkpoint(str(trained))
    vocab = len(json.loads((trained.parent / "vocab.trg.0.json").read_text()))
    assert ck.config == ModelConfig(src_vocab=vocab, tgt_vocab=vocab, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                    dropout=0.1, max_len=24, pad_id=0, share_embeddings=True)
    assert ck.describes.startswith("Sockeye checkpoint, checkpoint 1 (params.best")
    model = ck.build(ck.config)
    missing, unexpected = model.load_state_dict(dict(ck.state), strict=False)
    assert not unexpected and not missing
    assert model.opt.optimizer_betas == [0.9, 0.98] and model.sockeye_config.config_encoder.preprocess_sequence == ""
    from sockeye.model import load_model

    theirs, _, _ = load_model(str(trained.parent), inference_only=False)
    src, tgt = torch.tensor([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]]), torch.tensor([[2, 5, 6, 0], [2, 7, 8, 9]])
    lengths = torch.stack([(src != 0).sum(1), torch.zeros(2, dtype=torch.long)], 1)
    with torch.no_grad():
        want = theirs.eval()(src[:, :, None], lengths, tgt[:, :, None], (tgt != 0).sum(1))["logits"]
        assert torch.allclose(model.eval()(src, tgt), want, atol=1e-6), "not what sockeye's load_model computes"


def suite(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, list[dict]]]:
    out = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"
    res = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider",
                          f"--results-json={out}", *args], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    records: dict[str, list[dict]] = {}
    if out.exists():
        for r in json.loads(out.read_text())["tests"]:
            records.setdefault(r["clause"], []).append(r)
    return res, records


def verdicts(records: dict[str, list[dict]]) -> dict[str, str]:
    out = {}
    for clause, rs in records.items():
        judged = [r["outcome"] for r in rs if r["outcome"] != "skipped"]
        if clause and judged:
            out[clause] = "fail" if any(o in ("failed", "xfailed", "error") for o in judged) else "pass"
    return out


@pytest.mark.slow
def test_the_checkpoint_is_audited_as_saved(trained, tmp_path):
    """Every clause judged on the trained weights gets the verdict the built-in gets at the checkpoint's sizes."""
    c = tk.read_checkpoint(str(trained)).config
    sizes = (f"src_vocab={c.src_vocab},d_model={c.d_model},h={c.n_heads},d_ff={c.d_ff},N={c.n_layers},"
             f"max_len={c.max_len},pad_id={c.pad_id},dropout={c.dropout}")
    res, on_weights = suite(tmp_path, "--impl=sockeye", f"--weights={trained}")
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-2000:]
    judged = verdicts(on_weights)
    assert judged, "no clause was judged on the checkpoint"
    res2, built_in = suite(tmp_path, "--impl=sockeye", f"--config={sizes}", f"--clause={','.join(judged)}")
    assert res2.returncode in (0, 1), res2.stdout[-3000:] + res2.stderr[-2000:]
    reference = verdicts(built_in)
    differ = {k: (v, reference.get(k)) for k, v in judged.items() if reference.get(k) != v}
    assert not differ, f"clause: (on the checkpoint, built-in at its sizes): {differ}"


def test_a_file_of_another_kind_is_one_line(tmp_path, capsys):
    other = tmp_path / "model_step_3.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "generator": {}, "vocab": {}}, other)
    with pytest.raises(ValueError, match=r"not a Sockeye checkpoint \(found a dict with keys \['generator', 'model', "
                                         r"'vocab'\]\); accepted: a params\.best or params\.NNNNN file saved by "
                                         r"sockeye-train 3\.x"):
        tk.read_checkpoint(str(other))
    res, _ = suite(tmp_path, "--impl=sockeye", f"--weights={other}", "--clause=model.shape")
    assert res.returncode == 4
    line = next(ln for ln in res.stderr.splitlines() if "--weights:" in ln)
    assert "not a Sockeye checkpoint (found a dict with keys ['generator', 'model', 'vocab'])" in line
    from aiayn_conformance.cli import main

    assert main(["audit", "--impl", "sockeye", "--weights", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a Sockeye checkpoint" in err
