"""The built-in plugins ``opennmt-py`` and ``opennmt-py-defaults`` (implementations/builtins/tk_opennmt.py).

1. The transplant is right: ``opennmt-py`` holding the canonical weights computes what this project's ``prenorm``
   built-in computes with them (OpenNMT-py's layers are pre-norm with a final norm per stack), and not what the
   reference computes; ``opennmt-py-defaults`` computes what ``opennmt-py`` computes once its positional encoding
   (which carries the sqrt(d_model) scale) is taken out, and the FFN biases it cannot hold are zero.
2. Decoding runs through OpenNMT-py's own code: the decoder's cached steps equal the full forward; the translator's
   length penalty counts the start symbol and its limit is taken from the padded batch width (both declared).
3. Every cited line matches the installed release; the install command is what ``aiayn list`` shows without it.
4. A checkpoint saved by ``onmt_train`` (a few steps on tests/fixtures/toolkits/opennmt) is read with its sizes and
   options, and audited as saved: each clause judged on its weights gets the built-in's verdict at its sizes; a file
   of another kind is refused in one line.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onmt")

from toolkit_witness import CONFIGS, agree, batch  # noqa: E402

from aiayn_conformance.conformance.helpers.transplant import reference_twin, visible_state  # noqa: E402
from aiayn_conformance.implementations import get_registry  # noqa: E402
from aiayn_conformance.implementations.builtins import prenorm  # noqa: E402
from aiayn_conformance.implementations.builtins import tk_opennmt as tk  # noqa: E402
from aiayn_conformance.implementations.builtins import tk_opennmt_defaults as tkd  # noqa: E402
from aiayn_conformance.implementations.builtins.tk_citations import cited  # noqa: E402
from aiayn_conformance.spec.config import ModelConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "toolkits" / "opennmt"


# -- 1. transplant ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", list(CONFIGS))
def test_opennmt_holding_canonical_weights_is_the_prenorm_model(which):
    cfg = CONFIGS[which]
    state = visible_state(cfg, seed=5)
    model = tk.build_paper(cfg).eval()
    model.load_reference_state(state)
    twin = prenorm.build(cfg).eval()
    twin.load_reference_state(state)
    assert agree(model, twin, cfg), "opennmt-py with canonical weights is not the pre-norm model"
    assert not agree(model, reference_twin(cfg, state), cfg), "pre-norm does not reach the output: proves nothing"


def test_the_mapping_is_what_makes_it_agree():
    """A wrong line of the mapping (two canonical attention matrices exchanged) breaks the agreement."""
    cfg = CONFIGS["tied"]
    state = visible_state(cfg, seed=5)
    swapped = dict(state)
    swapped["decoder.1.cross_attn.q.weight"], swapped["decoder.1.cross_attn.k.weight"] = (
        state["decoder.1.cross_attn.k.weight"], state["decoder.1.cross_attn.q.weight"])
    model = tk.build_paper(cfg).eval()
    model.load_reference_state(swapped)
    twin = prenorm.build(cfg).eval()
    twin.load_reference_state(state)
    assert not agree(model, twin, cfg)


def test_defaults_are_the_paper_registration_without_its_positional_encoding():
    """At the parser's defaults OpenNMT-py adds no positional encoding, and with it goes the sqrt(d_model) scale
    (PositionalEncoding applies both); the FFN has no biases (it can hold none of the canonical ones)."""
    cfg = CONFIGS["untied"]
    state = visible_state(cfg, seed=5, adjust=lambda n, t: torch.zeros_like(t) if ".ffn.w" in n and
                          n.endswith(".bias") else t)
    defaults = tk.build_defaults(cfg).eval()
    defaults.load_reference_state(state)
    paper = tk.build_paper(cfg).eval()
    paper.load_reference_state(state)
    assert not agree(defaults, paper, cfg)
    for stack in (paper.model.encoder, paper.model.decoder):
        del stack.embeddings.make_embedding.pe  # the table and the scale
        stack.embeddings.position_encoding = False
    assert agree(defaults, paper, cfg)
    assert not torch.any(defaults.positional_encoding(5)), "the defaults add no table"


def test_loading_twice_gives_the_same_model():
    cfg = CONFIGS["pad-3"]
    once, twice = tk.build_paper(cfg).eval(), tk.build_paper(cfg).eval()
    once.load_reference_state(visible_state(cfg, seed=2))
    twice.load_reference_state(visible_state(cfg, seed=1))
    twice.load_reference_state(visible_state(cfg, seed=2))
    src, tgt = batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(once(src, tgt), twice(src, tgt))


# -- 2. decoding through the toolkit ------------------------------------------------------------------------------
def test_cached_steps_equal_the_full_forward():
    cfg = CONFIGS["pad-3"]
    model = tk.build_paper(cfg).eval()
    model.load_reference_state(visible_state(cfg, seed=3))
    src, _ = batch(cfg)
    rows = torch.tensor([0, 0, 1, 2, 2])
    tokens = torch.randint(4, cfg.tgt_vocab, (5, len(rows)), generator=torch.Generator().manual_seed(3))
    state = model.reorder_state(model.begin_decoding(src), rows)
    worst = 0.0
    with torch.no_grad():
        for t in range(tokens.size(0)):
            scores, state = model.decode_step(state, tokens[t])
            if t == 2:  # a beam reordering in the middle, through the decoder's map_state
                swap = torch.tensor([1, 0, 2, 4, 3])
                state, rows, tokens = model.reorder_state(state, swap), rows[swap], tokens[:, swap]
                scores = scores[swap]
            full = model(src[rows], tokens[:t + 1].T)[:, -1]
            worst = max(worst, (scores.log_softmax(-1) - full.log_softmax(-1)).abs().max().item())
    assert worst < 1e-4, f"the decoder's cached steps differ from the full forward by {worst:.3g}"


def test_the_length_penalty_counts_the_start_symbol(monkeypatch):
    """decode.beam's reason: -length_penalty wu scores the first output token with cur_len 2."""
    import onmt.translate.penalties as penalties

    seen: list[int] = []
    wu = penalties.PenaltyBuilder.length_wu
    monkeypatch.setattr(penalties.PenaltyBuilder, "length_wu",
                        lambda self, cur_len, alpha=0.0: seen.append(cur_len) or wu(self, cur_len, alpha))
    model = tk.build_paper(CONFIGS["tied"]).eval()
    model.generate(torch.tensor([[5, 6, 7]]), bos_id=1, eos_id=2, beam_size=4, alpha=0.6, max_len=3)
    assert seen[:3] == [2, 3, 4], seen


def test_the_default_limit_is_the_padded_width_times_1_25_plus_5():
    """decode.max-length's reason: max_len=None gives every row int(min(250, width * 1.25 + 5))."""
    cfg = CONFIGS["tied"]
    model = tk.build_paper(cfg).eval()
    model.load_reference_state(visible_state(cfg, seed=4))
    src = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 0, 0, 0, 0]])
    out = model.generate(src, bos_id=1, eos_id=36, beam_size=1, alpha=0.0)
    assert out.size(1) <= int(6 * 1.25 + 5) == 12


# -- 3. declarations and install ----------------------------------------------------------------------------------
def test_every_citation_has_its_line_and_matches_the_installed_release():
    """Each registration's CITED is what its reasons and notes cite, every line of the table is cited by one of
    them, and each fragment is on its line in the installed release."""
    for module in (tk, tkd):
        texts = [*module.DEVIATIONS.values(), module.NOTES]
        assert module.CITED == cited(tk.LINES, texts, "onmt/") and module.CITED, module.__name__
        assert all(re.search(r"\.py:\d+", why) for why in module.DEVIATIONS.values())
    assert set(tk.CITED) | set(tkd.CITED) == set(tk.LINES), sorted(set(tk.LINES) - set(tk.CITED) - set(tkd.CITED))
    from importlib import metadata

    if metadata.version("OpenNMT-py") != tk.WRITTEN_FOR.split()[1]:
        pytest.skip("another release is installed")
    site = Path(importlib.util.find_spec("onmt").origin).parent.parent
    wrong = []
    for where, fragment in tk.LINES.items():
        path, line = where.rsplit(":", 1)
        text = (site / path).read_text().splitlines()[int(line) - 1]
        if fragment not in text:
            wrong.append(f"{where}: expected {fragment!r}, found {text.strip()!r}")
    assert not wrong, "\n".join(wrong)


def test_registrations_and_the_install_command_when_missing(monkeypatch):
    registry = get_registry()
    for name, deviations in (("opennmt-py", tk.DEVIATIONS), ("opennmt-py-defaults", tkd.DEVIATIONS)):
        impl = registry.get(name)
        assert impl.written_for == tk.WRITTEN_FOR and dict(impl.deviations) == deviations and not impl.unavailable
        assert impl.read_checkpoint is tk.read_checkpoint
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onmt" else real(name, *a))
    reason = tk.opennmt_unavailable()
    assert reason.startswith("OpenNMT-py is not installed") and tk.INSTALL in reason


# -- 4. a checkpoint as onmt_train saves it -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """onmt_build_vocab and onmt_train (30 steps) on the fixture corpus: the checkpoint they save."""
    work = tmp_path_factory.mktemp("onmt")
    for f in FIXTURE.iterdir():
        shutil.copy(f, work / f.name)
    env = {"OMP_NUM_THREADS": "1"}
    import os

    for module, extra in (("onmt.bin.build_vocab", ["-n_sample", "-1"]), ("onmt.bin.train", [])):
        res = subprocess.run([sys.executable, "-m", module, "-config", "train.yaml", *extra], cwd=work,
                             capture_output=True, text=True, timeout=600, env={**os.environ, **env})
        assert res.returncode == 0, res.stderr[-3000:]
    return work / "run" / "model_step_30.pt"


@pytest.mark.slow  # it pays for the module's training run, which the slow checkpoint audit shares
def test_the_checkpoint_gives_its_sizes_and_weights(trained):
    ck = tk.read_checkpoint(str(trained))
    assert ck.config == ModelConfig(src_vocab=ck.config.src_vocab, tgt_vocab=ck.config.src_vocab, d_model=32,
                                    n_heads=4, d_ff=64, n_layers=2, dropout=0.1, max_len=24, pad_id=0,
                                    share_embeddings=True, norm_eps=1e-6)
    assert ck.describes.startswith("OpenNMT-py checkpoint, step 30")
    model = ck.build(ck.config)
    missing, unexpected = model.load_state_dict(dict(ck.state), strict=False)
    assert not unexpected and not [k for k in missing if not k.endswith(".pe.pe")]
    saved = torch.load(trained, weights_only=False)
    torch.testing.assert_close(model.model.generator.bias, saved["generator"]["bias"])


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
    """clause -> "pass" / "fail" over the checks that judged it (skipped checks aside)."""
    out = {}
    for clause, rs in records.items():
        judged = [r["outcome"] for r in rs if r["outcome"] != "skipped"]
        if clause and judged:
            out[clause] = "fail" if any(o in ("failed", "xfailed", "error") for o in judged) else "pass"
    return out


@pytest.mark.slow
def test_the_checkpoint_is_audited_as_saved(trained, tmp_path):
    """Every clause judged on the trained weights gets the verdict the built-in gets at the checkpoint's sizes."""
    ck = tk.read_checkpoint(str(trained))
    c = ck.config
    sizes = (f"src_vocab={c.src_vocab},d_model={c.d_model},h={c.n_heads},d_ff={c.d_ff},N={c.n_layers},"
             f"max_len={c.max_len},pad_id={c.pad_id},dropout={c.dropout}")
    res, on_weights = suite(tmp_path, "--impl=opennmt-py", f"--weights={trained}")
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-2000:]
    judged = verdicts(on_weights)
    assert judged, "no clause was judged on the checkpoint"
    res2, built_in = suite(tmp_path, "--impl=opennmt-py", f"--config={sizes}", f"--clause={','.join(judged)}")
    assert res2.returncode in (0, 1), res2.stdout[-3000:] + res2.stderr[-2000:]
    reference = verdicts(built_in)
    differ = {k: (v, reference.get(k)) for k, v in judged.items() if reference.get(k) != v}
    assert not differ, f"clause: (on the checkpoint, built-in at its sizes): {differ}"


def test_a_file_of_another_kind_is_one_line(tmp_path, capsys):
    plain = tmp_path / "plain.pt"
    torch.save({"model_state": {"w": torch.zeros(2)}}, plain)
    with pytest.raises(ValueError, match=r"not an OpenNMT-py checkpoint \(found a dict with keys \['model_state'\]\); "
                                         r"accepted: a \.pt saved by OpenNMT-py 3\.x's onmt_train"):
        tk.read_checkpoint(str(plain))
    res, _ = suite(tmp_path, "--impl=opennmt-py", f"--weights={plain}", "--clause=model.shape")
    assert res.returncode == 4
    line = next(ln for ln in res.stderr.splitlines() if "--weights:" in ln)
    assert "not an OpenNMT-py checkpoint (found a dict with keys ['model_state'])" in line
    from aiayn_conformance.cli import main

    assert main(["audit", "--impl", "opennmt-py", "--weights", str(plain)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not an OpenNMT-py checkpoint" in err
