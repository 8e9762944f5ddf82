"""The built-in plugins ``fairseq`` and ``fairseq-defaults`` (implementations/builtins/tk_fairseq.py).

1. The transplant is right: ``fairseq`` holding the canonical weights computes what the reference computes with them
   once the reference's positional table stands in fairseq's (its table is the only difference; without the swap the
   two differ); ``fairseq-defaults`` computes what ``fairseq`` computes with untied embeddings.
2. Decoding runs through fairseq's own code: the decoder's incremental steps equal the full forward for reorders
   within a source's rows, and not across sources (the cross-attention cache is kept on a same-size reorder,
   declared); SequenceGenerator forbids the end symbol at the first step (declared).
3. The recipe's declared behaviours: the schedule one update late, the decoder input starting with </s>, fairseq's
   Adam rule.
4. Every cited line matches the installed release; the install command is what ``aiayn list`` shows without it.
5. A checkpoint saved by fairseq's Trainer (a few updates on tests/fixtures/toolkits/fairseq, binarized by
   fairseq-preprocess) is read with its sizes and options, and audited as saved: each clause judged on its weights
   gets the built-in's verdict at its sizes; a file of another kind is refused in one line.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")

from toolkit_witness import CONFIGS, agree, batch  # noqa: E402

from aiayn_conformance.conformance.helpers.transplant import reference_twin, visible_state  # noqa: E402
from aiayn_conformance.implementations import get_registry  # noqa: E402
from aiayn_conformance.implementations.builtins import tk_fairseq as tk  # noqa: E402
from aiayn_conformance.implementations.builtins import tk_fairseq_defaults as tkd  # noqa: E402
from aiayn_conformance.implementations.builtins.tk_citations import cited  # noqa: E402
from aiayn_conformance.spec.config import ModelConfig  # noqa: E402
from aiayn_conformance.spec.training import TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "toolkits" / "fairseq"


def with_table(model: tk.FairseqAdapter, table: torch.Tensor) -> tk.FairseqAdapter:
    """``model`` with ``table`` (positions 0..) in its sinusoidal buffers, from row padding_idx + 1 on."""
    for stack in (model.model.encoder, model.model.decoder):
        weights = stack.embed_positions.weights
        weights[tk.PAD + 1:tk.PAD + 1 + table.size(0)] = table
    return model


# -- 1. transplant ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", list(CONFIGS))
def test_fairseq_holding_canonical_weights_is_the_reference_but_for_its_table(which):
    cfg = CONFIGS[which]
    state = visible_state(cfg, seed=5)
    model = tk.build_paper(cfg).eval()
    model.load_reference_state(state)
    reference = reference_twin(cfg, state).eval()
    assert not agree(model, reference, cfg), "the positional table does not reach the output: proves nothing"
    with_table(model, reference.positional_encoding(cfg.max_len))
    assert agree(model, reference, cfg), "fairseq with canonical weights and the reference's table is not the reference"


def test_the_mapping_is_what_makes_it_agree():
    """A wrong line of the mapping (two canonical attention matrices exchanged) breaks the agreement."""
    cfg = CONFIGS["tied"]
    state = visible_state(cfg, seed=5)
    swapped = dict(state)
    swapped["decoder.1.cross_attn.q.weight"], swapped["decoder.1.cross_attn.k.weight"] = (
        state["decoder.1.cross_attn.k.weight"], state["decoder.1.cross_attn.q.weight"])
    model = tk.build_paper(cfg).eval()
    model.load_reference_state(swapped)
    reference = reference_twin(cfg, state).eval()
    with_table(model, reference.positional_encoding(cfg.max_len))
    assert not agree(model, reference, cfg)


def test_the_table_is_fairseqs_from_row_padding_idx_plus_one():
    """position.formula's reason: sin | cos halves, frequencies 10000^(-i/(d/2 - 1)), the first token at row 2."""
    cfg = CONFIGS["tied"]
    table = tk.build_paper(cfg).positional_encoding(6)
    half, d = cfg.d_model // 2, cfg.d_model
    rows = torch.arange(tk.PAD + 1, tk.PAD + 7, dtype=torch.float)[:, None]
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    torch.testing.assert_close(table, torch.cat([torch.sin(rows * freqs), torch.cos(rows * freqs)], dim=1))
    assert table.shape == (6, d)


def test_defaults_are_the_paper_registration_untied():
    cfg = CONFIGS["untied"]
    state = visible_state(cfg, seed=5)
    defaults, paper = tk.build_defaults(cfg).eval(), tk.build_paper(cfg).eval()
    defaults.load_reference_state(state)
    paper.load_reference_state(state)
    assert agree(defaults, paper, cfg)
    tied = CONFIGS["tied"]
    shared = tk.build_paper(tied).model
    assert shared.encoder.embed_tokens.weight is shared.decoder.output_projection.weight
    own = tk.build_defaults(tied).model
    assert own.encoder.embed_tokens.weight is not own.decoder.embed_tokens.weight
    assert own.decoder.embed_tokens.weight is not own.decoder.output_projection.weight


def test_loading_twice_gives_the_same_model():
    cfg = CONFIGS["pad-3"]
    once, twice = tk.build_paper(cfg).eval(), tk.build_paper(cfg).eval()
    once.load_reference_state(visible_state(cfg, seed=2))
    twice.load_reference_state(visible_state(cfg, seed=1))
    twice.load_reference_state(visible_state(cfg, seed=2))
    src, tgt = batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(once(src, tgt), twice(src, tgt))


def test_ids_are_relabelled_to_fairseqs_specials():
    for pad in (0, 1, 2, 3, 9):
        ids = tk.fairseq_ids(12, pad)
        assert sorted(ids.tolist()) == list(range(12))
        assert int(ids[pad]) == tk.PAD
        for audit, theirs in ((1, tk.BOS), (2, tk.EOS)):
            if audit != pad:
                assert int(ids[audit]) == theirs


# -- 2. decoding through the toolkit ------------------------------------------------------------------------------
def cached_minus_full(model: tk.FairseqAdapter, src: torch.Tensor, rows: torch.Tensor, swap: torch.Tensor) -> float:
    """Largest |log-softmax difference| between the incremental steps and the full forward, with ``swap`` applied
    before the third step."""
    tokens = torch.randint(4, model.config.tgt_vocab, (5, len(rows)), generator=torch.Generator().manual_seed(3))
    state = model.reorder_state(model.begin_decoding(src), rows)
    worst = 0.0
    with torch.no_grad():
        for t in range(tokens.size(0)):
            if t == 2:
                state, rows, tokens = model.reorder_state(state, swap), rows[swap], tokens[:, swap]
            scores, state = model.decode_step(state, tokens[t])
            full = model(src[rows], tokens[:t + 1].T)[:, -1]
            worst = max(worst, (scores.log_softmax(-1) - full.log_softmax(-1)).abs().max().item())
    return worst


def test_incremental_steps_agree_within_a_source_and_not_across():
    """decode.incremental's reason: a same-size reorder keeps the cross-attention cache (multihead_attention.py:842):
    right when rows move among one source's copies, wrong when a row moves to another source."""
    cfg = CONFIGS["pad-3"]
    model = tk.build_paper(cfg).eval()
    model.load_reference_state(visible_state(cfg, seed=3))
    src, _ = batch(cfg)
    rows = torch.tensor([0, 0, 1, 1, 2, 2])
    assert cached_minus_full(model, src, rows, torch.tensor([1, 0, 3, 2, 5, 4])) < 1e-4
    assert cached_minus_full(model, src, rows, torch.tensor([2, 3, 4, 5, 0, 1])) > 1e-2


def test_the_end_symbol_is_forbidden_at_the_first_step():
    """decode.greedy's reason: min_len 1 (sequence_generator.py:395) — the most probable first token, made the end
    symbol, is not emitted."""
    cfg = CONFIGS["tied"]
    model = tk.build_paper(cfg).eval()
    model.load_reference_state(visible_state(cfg, seed=4))
    src = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        first = int(model(src, torch.tensor([[1]]))[0, -1, 3:].argmax()) + 3  # not pad, bos or eos
    out = model.generate(src, bos_id=1, eos_id=first, beam_size=1, alpha=0.0, max_len=5)
    assert int(out[0, 0]) != first and first in out[0].tolist()


# -- 3. the recipe ------------------------------------------------------------------------------------------------
def test_the_schedule_runs_one_update_late():
    """train.lr-schedule's reason: update 1 runs at warmup_init_lr = 0, update k at Eq. (3)'s step k - 1."""
    cfg = CONFIGS["tied"]
    model = tk.build_paper(cfg)
    tc = TrainConfig()
    optimizer = model.make_optimizer(model.parameters(), tc)
    scheduler = model.make_scheduler(optimizer, tc)
    rates = []
    for _ in range(3):
        rates.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    eq3 = [cfg.d_model ** -0.5 * min(k ** -0.5, k * tc.warmup_steps ** -1.5) for k in (1, 2)]
    assert rates[0] == 0.0
    assert rates[1:] == pytest.approx(eq3)


def test_the_decoder_input_starts_with_the_end_symbol():
    """train.shift's reason: collate moves the target's </s> to the front (language_pair_dataset.py:105)."""
    model = tk.build_paper(CONFIGS["tied"])
    target = torch.tensor([[7, 8, 9, 2], [5, 2, 0, 0]])
    decoder_input, labels = model.make_batch(target, 1)
    assert decoder_input.tolist() == [[2, 7, 8, 9], [2, 5, 0, 0]]
    assert labels.tolist() == target.tolist()


def test_fairseqs_adam_adds_epsilon_before_the_bias_correction():
    """train.optimizer's reason: after one step the update is lr * g / (|g| + eps / sqrt(1 - beta2))."""
    model = tk.build_paper(CONFIGS["tied"])
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    optimizer = model.make_optimizer([p], TrainConfig())
    for group in optimizer.param_groups:
        group["lr"] = 1e-3
    p.grad = torch.full_like(p, 1e-9)
    optimizer.step()
    fairseq_rule = -1e-3 * 1e-9 / (1e-9 + 1e-9 / math.sqrt(1 - 0.98))
    assert float(p.detach()) == pytest.approx(fairseq_rule, rel=1e-6)
    assert float(p.detach()) != pytest.approx(-1e-3 * 1e-9 / (1e-9 + 1e-9), rel=1e-2)  # torch's Adam


# -- 4. declarations and install ----------------------------------------------------------------------------------
def test_every_citation_has_its_line_and_matches_the_installed_release():
    for module in (tk, tkd):
        texts = [*module.DEVIATIONS.values(), module.NOTES]
        assert module.CITED == cited(tk.LINES, texts, "fairseq/") and module.CITED, module.__name__
        assert all(re.search(r"\.py:\d+", why) for why in module.DEVIATIONS.values())
    assert set(tk.CITED) | set(tkd.CITED) == set(tk.LINES), sorted(set(tk.LINES) - set(tk.CITED) - set(tkd.CITED))
    from importlib import metadata

    if metadata.version("fairseq-fixed") != tk.WRITTEN_FOR.split()[1]:
        pytest.skip("another release is installed")
    site = Path(importlib.util.find_spec("fairseq").origin).parent.parent
    wrong = []
    for where, fragment in tk.LINES.items():
        path, line = where.rsplit(":", 1)
        text = (site / path).read_text().splitlines()[int(line) - 1]
        if fragment not in text:
            wrong.append(f"{where}: expected {fragment!r}, found {text.strip()!r}")
    assert not wrong, "\n".join(wrong)


def test_registrations_and_the_install_command_when_missing(monkeypatch):
    registry = get_registry()
    for name, deviations in (("fairseq", tk.DEVIATIONS), ("fairseq-defaults", tkd.DEVIATIONS)):
        impl = registry.get(name)
        assert impl.written_for == tk.WRITTEN_FOR and dict(impl.deviations) == deviations and not impl.unavailable
        assert impl.read_checkpoint is tk.read_checkpoint and impl.install == tk.INSTALL
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fairseq" else real(name, *a))
    reason = tk.fairseq_unavailable()
    assert reason.startswith("fairseq-fixed is not installed") and tk.INSTALL in reason


def test_the_install_command_sets_readthedocs_for_the_fairseq_step():
    from aiayn_conformance.commands.install import steps

    parsed = steps(tk.INSTALL)
    assert [env for env, _ in parsed] == [{}, {"READTHEDOCS": "1"}]
    assert all(argv[:3] == [sys.executable, "-m", "pip"] for _, argv in parsed)
    assert parsed[1][1][-1] == "fairseq-fixed==0.12.3.1" and "--no-build-isolation" in parsed[1][1]


# -- 5. a checkpoint as fairseq saves it --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """fairseq-preprocess on the fixture corpus, then 30 updates of fairseq's Trainer (train_fairseq.py)."""
    work = tmp_path_factory.mktemp("fairseq")
    for f in FIXTURE.iterdir():
        shutil.copy(f, work / f.name)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    commands = (
        [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", "train", "--validpref", "valid", "--destdir", "data-bin", "--joined-dictionary",
         "--workers", "1"],
        [sys.executable, "train_fairseq.py", "data-bin", "checkpoints", "30"],
    )
    for argv in commands:
        res = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
    return work / "checkpoints" / "checkpoint_last.pt"


@pytest.mark.slow  # it pays for the module's training run, which the slow checkpoint audit shares
def test_the_checkpoint_gives_its_sizes_and_weights(trained):
    ck = tk.read_checkpoint(str(trained))
    vocab = ck.config.src_vocab
    assert ck.config == ModelConfig(src_vocab=vocab, tgt_vocab=vocab, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                    dropout=0.1, max_len=24, pad_id=0, share_embeddings=True)
    assert ck.describes.startswith("fairseq checkpoint, 30 updates (transformer_vaswani_wmt_en_de_big")
    model = ck.build(ck.config)
    missing, unexpected = model.load_state_dict(dict(ck.state), strict=False)
    assert not unexpected and not missing
    saved = torch.load(trained, weights_only=False)
    torch.testing.assert_close(model.model.encoder.embed_tokens.weight, saved["model"]["encoder.embed_tokens.weight"])
    assert model.model.decoder.output_projection.weight is model.model.encoder.embed_tokens.weight


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
    res, on_weights = suite(tmp_path, "--impl=fairseq", f"--weights={trained}")
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-2000:]
    judged = verdicts(on_weights)
    assert judged, "no clause was judged on the checkpoint"
    res2, built_in = suite(tmp_path, "--impl=fairseq", f"--config={sizes}", f"--clause={','.join(judged)}")
    assert res2.returncode in (0, 1), res2.stdout[-3000:] + res2.stderr[-2000:]
    reference = verdicts(built_in)
    differ = {k: (v, reference.get(k)) for k, v in judged.items() if reference.get(k) != v}
    assert not differ, f"clause: (on the checkpoint, built-in at its sizes): {differ}"


def test_a_file_of_another_kind_is_one_line(tmp_path, capsys):
    onmt = tmp_path / "onmt.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "generator": {}, "vocab": {}, "opt": None}, onmt)
    found = r"not a fairseq checkpoint \(found a dict with keys \['generator', 'model', 'opt', 'vocab'\]\); "
    with pytest.raises(ValueError, match=found + r"accepted: a \.pt saved by fairseq 0\.12's fairseq-train"):
        tk.read_checkpoint(str(onmt))
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"not a fairseq checkpoint \(torch\.load failed: "):
        tk.read_checkpoint(str(text))
    res, _ = suite(tmp_path, "--impl=fairseq", f"--weights={onmt}", "--clause=model.shape")
    assert res.returncode == 4
    line = next(ln for ln in res.stderr.splitlines() if "--weights:" in ln)
    assert "not a fairseq checkpoint (found a dict with keys ['generator', 'model', 'opt', 'vocab'])" in line
    from aiayn_conformance.cli import main

    assert main(["audit", "--impl", "fairseq", "--weights", str(onmt)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a fairseq checkpoint" in err
