"""Bad input through `ap-solve` (issue 11, input half): exit 2 with one `ap-solve: error:` line
naming the file or field, no traceback, in bounded time."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoparallel_cp.cli import main

JOB = ["-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "32"]


def _files(tmp: Path) -> dict[str, Path]:
    (tmp / "rand.yaml").write_bytes(bytes(range(256)) * 8)
    (tmp / "bomb.yaml").write_text(
        'a0: &a0 ["x","x","x","x","x","x","x","x","x"]\n'
        + "".join(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)))
    (tmp / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    (tmp / "hf.json").write_text('{"architectures": 5, "hidden_size": 4096}')
    (tmp / "bool.yaml").write_text(
        "name: b\nnum_layers: true\nhidden_size: 4096\nffn_hidden_size: 14336\n"
        "num_attention_heads: 32\nvocab_size: 32000\n")
    gpu = "  gpu: {name: X, memory_gib: %s, bf16_tflops: %s, hbm_gbps: 3000}\n"
    links = ("  intra_node: {bandwidth_gbps: 450}\n"
             "  inter_node: {bandwidth_gbps: 50, latency_us: %s}\n")
    head = "name: c\nnode_groups:\n- name: g\n  gpus_per_node: 8\n  num_nodes: %s\n"
    for name, vals in {"inf": ("4", ".inf", "1000", "5"), "nodes": ("1.0e+18", "80", "1000", "5"),
                       "tflops": ("4", "80", "1.0e-30", "5"),
                       "latency": ("4", "80", "1000", "1.0e+300")}.items():
        (tmp / f"{name}.yaml").write_text(head % vals[0] + gpu % vals[1:3] + links % vals[3])
    os.mkfifo(tmp / "fifo.yaml")
    return {p.stem: p for p in tmp.iterdir()}


CASES: list[tuple[str, list[str], str]] = [
    ("random bytes", ["evaluate", "-m", "{rand}", "-c", "dgx-h100", "--plan", "tp=8"], "UTF-8"),
    ("alias bomb", ["evaluate", "-m", "{bomb}", "-c", "dgx-h100", "--plan", "tp=8"], "bomb"),
    ("deep json", ["evaluate", "-m", "{deep}", "-c", "dgx-h100", "--plan", "tp=8"], "deep"),
    ("hf wrong type", ["evaluate", "-m", "{hf}", "-c", "dgx-h100", "--plan", "tp=8"],
     "architectures"),
    ("bool layers", ["evaluate", "-m", "{bool}", "-c", "dgx-h100", "--plan", "tp=8"],
     "num_layers"),
    ("fifo", ["evaluate", "-m", "{fifo}", "-c", "dgx-h100", "--plan", "tp=8"], "fifo"),
    ("directory", ["evaluate", "-m", "{dir}", "-c", "dgx-h100", "--plan", "tp=8"], "directory"),
    ("memory inf", ["solve", "-m", "llama3-8b", "-c", "{inf}"], "memory_gib"),
    ("1e18 nodes", ["solve", "-m", "llama3-8b", "-c", "{nodes}"], "num_nodes"),
    ("tflops 1e-30", ["solve", "-m", "llama3-8b", "-c", "{tflops}"], "bf16_tflops"),
    ("latency 1e300", ["solve", "-m", "llama3-8b", "-c", "{latency}"], "latency_us"),
    ("plan mbs=0", ["evaluate", *JOB, "--plan", "tp=8,mbs=0"], "mbs"),
    ("plan tp=0", ["evaluate", *JOB, "--plan", "tp=0"], "tp"),
    ("plan pp=0", ["evaluate", *JOB, "--plan", "pp=0"], "pp"),
    ("plan cp=0", ["evaluate", *JOB, "--plan", "cp=0"], "cp"),
    ("plan vpp=0", ["evaluate", *JOB, "--plan", "pp=2,vpp=0"], "vpp"),
    ("plan twice", ["evaluate", *JOB, "--plan", "tp=8,tp=4"], "twice"),
    ("fix tp=0", ["solve", *JOB, "--fix", "tp=0"], "tp"),
    ("fix vpp=0", ["solve", *JOB, "--fix", "vpp=0"], "vpp"),
    ("fix twice", ["solve", *JOB, "--fix", "tp=8,tp=4"], "twice"),
    ("batch 1e15", ["solve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "64",
                    "--global-batch", "1000000000000000"], "--global-batch"),
    ("seq 2^30", ["solve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "64",
                  "--seq-len", str(2**30)], "--seq-len"),
    ("fp8 on A100", ["solve", "-m", "llama3-8b", "-c", "dgx-a100", "--gpus", "8",
                     "--recipe", "megatron-fp8"], "A100"),
]


@pytest.mark.parametrize("name,args,text", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2(tmp_path: Path, name: str, args: list[str], text: str) -> None:
    files = _files(tmp_path)
    (tmp_path / "dir").mkdir()
    files["dir"] = tmp_path / "dir"
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    t0 = time.perf_counter()
    res = CliRunner().invoke(main, argv)
    assert time.perf_counter() - t0 < 20
    out = res.output
    assert res.exit_code == 2, (res.exit_code, out, res.exception)
    assert "Traceback" not in out
    # one line naming the problem: ours, or click's own for an option out of its range
    assert "ap-solve: error:" in out or "Error: Invalid value for" in out, out
    assert text in out, out
