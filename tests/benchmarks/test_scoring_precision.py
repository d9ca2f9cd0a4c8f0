"""``benchmarks/scoring_precision.py`` at a tiny size: every variant timed, the agreement of
bfloat16 scoring with full precision reported in range."""

import torch

from benchmarks.scoring_precision import VARIANTS, agreement, main


def test_a_tiny_run_times_every_variant_and_reports_the_selection_agreement(capsys):
    out = main(
        [
            "--calls",
            "2",
            "--layers",
            "1",
            "--d-model",
            "32",
            "--context",
            "16",
            "--batch",
            "4",
            "--train-steps",
            "2",
            "--heldout",
            "8",
        ]
    )
    assert set(out["variants"]) == {f"{m}+{p}" for m, p in VARIANTS}
    assert out["variants"]["no_grad+model"]["vs_no_grad_fp32"] == 1.0
    assert all(v["min"] <= v["ms"] <= v["max"] for v in out["variants"].values())
    sel = out["bfloat16_selection"]
    assert -1.0 <= sel["spearman"] <= 1.0 and 0.0 <= sel["top_half_same"] <= 1.0
    assert '"variants"' in capsys.readouterr().out


def test_agreement_is_one_for_the_same_losses_and_low_for_reversed_ones():
    x = torch.arange(10.0)
    assert agreement(x, x) == {"spearman": 1.0, "top_half_same": 1.0}
    assert agreement(x, -x) == {"spearman": -1.0, "top_half_same": 0.0}
