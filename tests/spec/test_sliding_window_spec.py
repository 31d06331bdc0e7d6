"""ModelSpec sliding-window fields: which layers are windowed, and one-line errors for bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autoparallel_cp.cli import main
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.loaders import load_model
from autoparallel_cp.spec.validation import validate_model

BASE: dict[str, Any] = {"name": "w", "num_layers": 6, "hidden_size": 1024,
                        "ffn_hidden_size": 2816, "num_attention_heads": 8, "vocab_size": 32000}


def test_pattern_repeats_over_layers() -> None:
    m = validate_model({**BASE, "sliding_window_left": 127,
                        "sliding_window_layers": [True, False]}, "m.yaml")
    # Megatron window_attn_skip_freq=2: 1-based layers 1, 3, 5 windowed = 0-based 0, 2, 4
    assert [m.is_window_layer(i) for i in range(6)] == [True, False] * 3
    assert m.window_share(False) == 0.5
    every = validate_model({**BASE, "sliding_window_left": 4095}, "m.yaml")
    assert every.window_share(False) == 1.0
    assert validate_model(BASE, "m.yaml").window_share(False) == 0.0


def test_window_share_per_kind() -> None:
    m = validate_model({**BASE, "sliding_window_left": 64, "sliding_window_layers": [True, False],
                        "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 512,
                                "first_k_dense_layers": 1}}, "m.yaml")
    # dense: layer 0 (windowed); MoE: layers 1-5, of which 2 and 4 windowed
    assert m.window_share(False) == 1.0
    assert m.window_share(True) == pytest.approx(2 / 5)


@pytest.mark.parametrize(("bad", "field"), [
    ({"sliding_window_layers": [True]}, "sliding_window_layers"),
    ({"sliding_window_left": -1}, "sliding_window_left"),
    ({"sliding_window_left": 8, "sliding_window_layers": [False, False]},
     "sliding_window_layers"),
    ({"sliding_window_left": 8, "sliding_window_layers": []}, "sliding_window_layers"),
    ({"sliding_window_left": 8, "sliding_window_layers": [True] * 7}, "sliding_window_layers"),
    ({"sliding_window_left": 8, "sliding_window_layers": [1, 0]}, "sliding_window_layers.0"),
    ({"sliding_window_left": True}, "sliding_window_left"),
])
def test_bad_window_is_one_line_naming_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError, match=rf"m.yaml: field '{field}'"):
        validate_model({**BASE, **bad}, "m.yaml")


def test_yaml_file_round_trip_and_cli_exit_2(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("name: g\nnum_layers: 4\nhidden_size: 1024\nffn_hidden_size: 2816\n"
                    "num_attention_heads: 8\nvocab_size: 32000\nsliding_window_left: 128\n"
                    "sliding_window_layers: [true, false]\n")
    m = load_model(good)
    assert m.sliding_window_left == 128 and m.sliding_window_layers == (True, False)
    assert validate_model(m.model_dump(), "dump") == m
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("[true, false]", "[false, false]"))
    r = CliRunner().invoke(main, ["evaluate", "-m", str(bad), "-c", "dgx-h100", "--gpus", "8",
                                  "--global-batch", "8", "--plan", "tp=8"])
    assert r.exit_code == 2
    assert "sliding_window_layers" in r.output and "Traceback" not in r.output
