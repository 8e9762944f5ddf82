"""The decoding benchmark judges its targets from what it measured (synthetic timings: no model is run)."""

from benchmarks.decode_bench import Row, report


def row(decoder: str, search: str, batch: int, seconds: float) -> Row:
    return Row(decoder, search, batch, 50, [seconds * 0.9, seconds, seconds * 1.1], same="yes")


def test_each_target_is_met_or_missed_by_the_figures():
    rows = [
        row("eager cached", "greedy", 1, 1.0), row("eager recompute", "greedy", 1, 5.0),
        row("eager recompute, encoder once", "greedy", 1, 2.0), row("onnxruntime cached", "greedy", 1, 0.6),
        row("onnxruntime recompute, encoder once", "greedy", 1, 1.8), row("ctranslate2", "greedy", 1, 0.5),
        row("eager cached", "beam 4", 1, 4.0), row("onnxruntime cached", "beam 4", 1, 3.0),
        row("ctranslate2", "beam 4", 1, 1.0),
        row("eager cached", "greedy", 8, 2.0), row("eager recompute", "greedy", 8, 6.0),
        Row("ctranslate2", "greedy", 8, 50, error="RuntimeError: out of memory"),
    ]
    out = "\n".join(report(rows, "base", 2, 50, [], ["eager cached, batch 1: profile"]))
    assert "batch 1: recomputing the prefix through forward() takes 5.0x the cached decoder's time " \
           "(target >= 4x: met); recomputing the decoder only (encoder output reused) takes 2.0x" in out
    assert "batch 8: recomputing the prefix through forward() takes 3.0x the cached decoder's time " \
           "(target >= 4x: MISSED)" in out
    assert "onnxruntime cached takes 0.60x eager cached's time (target <= 0.7x: met)" in out
    assert "eager cached, batch 1: beam 4 costs 4.00x greedy (target <= 4.5x: met)" in out
    assert "onnxruntime cached, batch 1: beam 4 costs 5.00x greedy (target <= 4.5x: MISSED)" in out
    assert "greedy, batch 1: our best cached decoder (onnxruntime cached) takes 1.20x CTranslate2's time " \
           "(target <= 2x: met)" in out
    assert "beam 4, batch 1: our best cached decoder (onnxruntime cached) takes 3.00x CTranslate2's time " \
           "(target <= 2x: MISSED)" in out
    assert "| ctranslate2 | greedy | 8 | failed: RuntimeError: out of memory |" in out
    assert "| eager cached | greedy | 1 | 1.000 | ±10% | 50.0 | 1.00x | yes |" in out
    assert "- eager cached, batch 1: profile" in out
