"""The built-in plugins ``joeynmt`` and ``joeynmt-defaults`` (implementations/builtins/tk_joeynmt.py).

1. The transplant is right: ``joeynmt`` holding the canonical weights computes the reference's outputs (its
   projection biases, which the paper lacks, at 0; they are the departure it cannot be configured out of), and
   differs with them set; ``joeynmt-defaults`` computes the paper's model once its encoder layers are made post-norm
   and its embeddings scaled, and not before.
2. Decoding runs through JoeyNMT's own code: its decoding step equals the full forward, ``generate(beam_size=1)`` is
   ``search.py``'s greedy search with the end symbol forbidden at the first step, the default limit is 1.5 x the
   longest source, and the trainer's scheduler lags one update (all declared).
3. Every cited line matches the installed release; the install command is what ``aiayn list`` shows without it.
4. A checkpoint saved by ``python -m joeynmt train`` (a few updates on tests/fixtures/toolkits/joeynmt) is read with
   its config.yaml and vocabularies and audited as saved: each clause judged on its weights gets the built-in's
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

pytest.importorskip("joeynmt")

from toolkit_witness import CONFIGS, agree, batch, loaded  # noqa: E402

from aiayn_conformance.conformance.helpers.transplant import visible_state  # noqa: E402
from aiayn_conformance.implementations import get_registry  # noqa: E402
from aiayn_conformance.implementations.builtins import tk_joeynmt as tk  # noqa: E402
from aiayn_conformance.implementations.builtins import tk_joeynmt_defaults as tkd  # noqa: E402
from aiayn_conformance.implementations.builtins.tk_citations import cited  # noqa: E402
from aiayn_conformance.spec.config import ModelConfig  # noqa: E402
from aiayn_conformance.spec.training import TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "toolkits" / "joeynmt"


# -- 1. transplant ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", list(CONFIGS))
def test_joeynmt_holding_canonical_weights_is_the_reference(which):
    cfg = CONFIGS[which]
    model, ref = loaded(tk.build_paper, cfg)
    assert agree(model, ref, cfg), "joeynmt with canonical weights (biases 0) is not the reference"
    with torch.no_grad():  # the projection biases the paper lacks: set, they reach the output
        model.model.decoder.layers[0].src_trg_att.v_layer.bias.fill_(0.5)
    assert not agree(model, ref, cfg)


def test_the_id_exchange_and_the_mapping_are_what_makes_it_agree():
    """The pad id exchanged with JoeyNMT's 1 matters (pad-3), and so does each line of the mapping."""
    cfg = CONFIGS["pad-3"]
    model, ref = loaded(tk.build_paper, cfg)
    ids = torch.arange(cfg.tgt_vocab)
    model.src_ids.copy_(ids)  # no exchange: the audit's padding is not JoeyNMT's
    model.tgt_ids.copy_(ids)
    assert not agree(model, ref, cfg)
    state = visible_state(cfg, seed=5)
    swapped = {**state, "encoder.0.norm1.weight": state["encoder.0.norm2.weight"],
               "encoder.0.norm2.weight": state["encoder.0.norm1.weight"]}
    wrong = tk.build_paper(cfg).eval()
    wrong.load_reference_state(swapped)
    assert not agree(wrong, ref, cfg)


def test_defaults_are_the_paper_model_with_pre_norm_encoder_layers_and_unscaled_embeddings():
    cfg = CONFIGS["untied"]
    model, ref = loaded(tk.build_defaults, cfg)
    assert not agree(model, ref, cfg)
    model.model.src_embed.scale = model.model.trg_embed.scale = True
    assert not agree(model, ref, cfg), "the encoder layers are post-norm at the defaults"
    for layer in model.model.encoder.layers:
        layer._layer_norm_position = layer.feed_forward._layer_norm_position = "post"
    assert agree(model, ref, cfg)


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


def test_greedy_is_search_py_with_the_end_symbol_forbidden_first():
    """generate(beam_size=1) is the argmax trajectory of the adapter's own steps, except that the end symbol cannot
    come first (min_output_length 1), the start symbol is never chosen, and the limit is 1.5 x the
    longest source (decode.greedy and decode.max-length's reasons)."""
    cfg = CONFIGS["pad-3"]
    model, _ = loaded(tk.build_paper, cfg, seed=4)
    src, _ = batch(cfg)
    keep = (src != cfg.pad_id).sum(1)
    limit = int(keep.max() * 1.5)
    with torch.no_grad():
        first, _ = model.decode_step(model.begin_decoding(src), torch.full((src.size(0),), 1))
    first[:, 1] = float("-inf")
    ends = sorted(set(first.argmax(-1).tolist()) - {cfg.pad_id})
    assert ends, "no end symbol is a first argmax: the rule is not exercised"
    for eos in sorted(set(range(4, 10)) | set(ends)):
        got = model.generate(src, bos_id=1, eos_id=eos, beam_size=1, alpha=0.0)
        state = model.begin_decoding(src)
        tok = torch.full((src.size(0),), 1)
        want = []
        with torch.no_grad():
            for step in range(limit):
                scores, state = model.decode_step(state, tok)
                scores[:, 1] = float("-inf")  # the start symbol is never generated (search.py)
                if step < 1:
                    scores[:, eos] = float("-inf")
                tok = scores.argmax(-1)
                want.append(tok)
        expected = torch.full((src.size(0), limit), cfg.pad_id)
        for i, row in enumerate(torch.stack(want, 1).tolist()):
            row = row[:row.index(eos) + 1] if eos in row else row
            expected[i, :len(row)] = torch.tensor(row)
        assert got.size(1) <= limit
        padded = torch.nn.functional.pad(got, (0, limit - got.size(1)), value=cfg.pad_id)
        assert torch.equal(padded, expected), (eos, got, expected)


def test_the_scheduler_runs_one_update_late():
    """train.lr-schedule's reason: stepped as the trainer steps it, update k runs at Eq. (3)'s step k - 1."""
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
    assert rates == pytest.approx([eq3(1), eq3(1), eq3(2), eq3(3)])


def test_the_trainer_refuses_a_training_section_without_scheduling():
    """joeynmt-defaults' reason for naming `scheduling: plateau`: None, the default, is no scheduler."""
    from joeynmt.builders import build_scheduler
    from joeynmt.config import ConfigurationError

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ConfigurationError, match="Invalid scheduler"):
        build_scheduler(cfg={}, optimizer=optimizer, scheduler_mode="min", hidden_size=32)


# -- 3. declarations and install ----------------------------------------------------------------------------------
def test_every_citation_has_its_line_and_matches_the_installed_release():
    """Each registration's CITED is what its reasons and notes cite, every line of the table is cited by one of
    them, and each fragment is on its line in the installed release."""
    for module in (tk, tkd):
        texts = [*module.DEVIATIONS.values(), module.NOTES]
        assert module.CITED == cited(tk.LINES, texts, "joeynmt/") and module.CITED, module.__name__
        assert all(re.search(r"\.py:\d+", why) for why in module.DEVIATIONS.values())
    assert set(tk.CITED) | set(tkd.CITED) == set(tk.LINES), sorted(set(tk.LINES) - set(tk.CITED) - set(tkd.CITED))
    from importlib import metadata

    if metadata.version("joeynmt") != tk.WRITTEN_FOR.split()[1]:
        pytest.skip("another release is installed")
    site = Path(importlib.util.find_spec("joeynmt").origin).parent.parent
    wrong = []
    for where, fragment in tk.LINES.items():
        path, line = where.rsplit(":", 1)
        text = (site / path).read_text().splitlines()[int(line) - 1]
        if fragment not in text:
            wrong.append(f"{where}: expected {fragment!r}, found {text.strip()!r}")
    assert not wrong, "\n".join(wrong)


def test_registrations_and_the_install_command_when_missing(monkeypatch):
    registry = get_registry()
    for name, deviations in (("joeynmt", tk.DEVIATIONS), ("joeynmt-defaults", tkd.DEVIATIONS)):
        impl = registry.get(name)
        assert impl.written_for == tk.WRITTEN_FOR and dict(impl.deviations) == deviations and not impl.unavailable
        assert impl.read_checkpoint is tk.read_checkpoint
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "joeynmt" else real(name, *a))
    reason = tk.joeynmt_unavailable()
    assert reason.startswith("joeynmt is not installed") and tk.INSTALL in reason


# -- 4. a checkpoint as JoeyNMT's trainer saves it ----------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """`python -m joeynmt train` (3 updates) on the fixture corpus: the checkpoint it saves in its model directory."""
    work = tmp_path_factory.mktemp("joeynmt")
    for f in FIXTURE.iterdir():
        shutil.copy(f, work / f.name)
    res = subprocess.run([sys.executable, "-m", "joeynmt", "train", "train.yaml", "--skip-test"], cwd=work,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return work / "run" / "latest.ckpt"


@pytest.mark.slow  # it pays for the module's training run, which the slow checkpoint audit shares
def test_the_checkpoint_gives_its_sizes_and_weights(trained):
    ck = tk.read_checkpoint(str(trained))
    vocab = len((trained.parent / "trg_vocab.txt").read_text().splitlines())
    assert ck.config == ModelConfig(src_vocab=vocab, tgt_vocab=vocab, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                    dropout=0.1, max_len=24, pad_id=0, share_embeddings=True)
    assert ck.describes.startswith("JoeyNMT checkpoint, step ")
    model = ck.build(ck.config)
    missing, unexpected = model.load_state_dict(dict(ck.state), strict=False)
    assert not unexpected and not missing
    saved = torch.load(trained, weights_only=True)["model_state"]
    torch.testing.assert_close(model.model.decoder.layers[0].src_trg_att.q_layer.bias,
                               saved["decoder.layers.0.src_trg_att.q_layer.bias"])


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
    res, on_weights = suite(tmp_path, "--impl=joeynmt", f"--weights={trained}")
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-2000:]
    judged = verdicts(on_weights)
    assert judged, "no clause was judged on the checkpoint"
    res2, built_in = suite(tmp_path, "--impl=joeynmt", f"--config={sizes}", f"--clause={','.join(judged)}")
    assert res2.returncode in (0, 1), res2.stdout[-3000:] + res2.stderr[-2000:]
    reference = verdicts(built_in)
    differ = {k: (v, reference.get(k)) for k, v in judged.items() if reference.get(k) != v}
    assert not differ, f"clause: (on the checkpoint, built-in at its sizes): {differ}"


def test_a_file_of_another_kind_is_one_line(tmp_path, capsys):
    other = tmp_path / "model_step_3.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "generator": {}, "vocab": {}}, other)
    with pytest.raises(ValueError, match=r"not a JoeyNMT checkpoint \(found a dict with keys \['generator', 'model', "
                                         r"'vocab'\]\); accepted: a \.ckpt saved by JoeyNMT 2\.x's trainer"):
        tk.read_checkpoint(str(other))
    res, _ = suite(tmp_path, "--impl=joeynmt", f"--weights={other}", "--clause=model.shape")
    assert res.returncode == 4
    line = next(ln for ln in res.stderr.splitlines() if "--weights:" in ln)
    assert "not a JoeyNMT checkpoint (found a dict with keys ['generator', 'model', 'vocab'])" in line
    from aiayn_conformance.cli import main

    assert main(["audit", "--impl", "joeynmt", "--weights", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a JoeyNMT checkpoint" in err
