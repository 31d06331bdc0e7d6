"""Offloading to host memory by hand (cost/offload.py): transfer and CPU-Adam times, the GPU
and host bytes, the host-link presets and the rules."""

from __future__ import annotations

import pytest

from autoparallel_cp.api import load_cluster
from autoparallel_cp.cost import offload as O
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.steptime import step_time
from autoparallel_cp.spec import (
    RECIPES,
    ClusterSpec,
    GPUSpec,
    HostSpec,
    Job,
    LinkSpec,
    ModelSpec,
    NodeGroup,
)
from autoparallel_cp.spec.plan import Plan, plan_violations

HOST = HostSpec(link_gbps=64.0, memory_gib=2048.0, memory_gbps=614.4)


def _job(host: HostSpec | None = HOST, recipe: str = "megatron-bf16") -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    cl = ClusterSpec(name="c", node_groups=[NodeGroup(
        name="n", gpu=gpu, gpus_per_node=8, num_nodes=2, host=host,
        intra_node=LinkSpec(bandwidth_gbps=450), inter_node=LinkSpec(bandwidth_gbps=50))])
    m = ModelSpec(name="m", num_layers=16, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256)
    return Job(model=m, cluster=cl, recipe=RECIPES[recipe], seq_len=4096, global_batch=16)


def test_transfer_and_cpu_adam_by_hand() -> None:
    """1e9 parameters, all on the host, PCIe Gen5 64 GB/s, 614.4 GB/s DRAM over 8 GPUs:
    D2H of 4-byte gradients 4e9/64e9 = 62.5 ms, H2D of bf16 weights 31.25 ms, CPU Adam
    30e9 B / 76.8e9 B/s = 390.625 ms; Megatron pipelines them (the max), FSDP2 adds them
    (its sharded parameters are fp32: 62.5 ms back)."""
    job = _job()
    assert O.host_link_s(job, 0, 4e9) == pytest.approx(0.0625)
    assert O.cpu_adam_s(job, 0, 1e9) == pytest.approx(30e9 / (614.4e9 / 8))
    assert O.optimizer_offload_s(job, 0, 1e9, 1.0) == pytest.approx(0.390625)
    fsdp = _job(recipe="torchtitan-fsdp")
    assert O.optimizer_offload_s(fsdp, 0, 1e9, 1.0) == pytest.approx(
        0.0625 + 0.0625 + 0.390625)
    # half on the host: half of every part
    assert O.optimizer_offload_s(job, 0, 1e9, 0.5) == pytest.approx(0.390625 / 2)


def test_megatron_without_copy_overlap_runs_the_parts_in_turn() -> None:
    """Megatron-Core's HybridDeviceOptimizer without overlap_cpu_optimizer_d2h_h2d (its
    default) copies on the current stream and steps one CPU optimizer after the D2H
    (hybrid_optimizer.py:173-174,203-221 @d98e8a64): behaviour offload_copies_overlap False
    adds the parts, 62.5 + 390.625 + 31.25 ms for 1e9 parameters (bf16 weights back); True
    keeps the pipelined max, and None the framework default (Megatron: the max)."""
    job = _job()
    serial = job.model_copy(update={"recipe": job.recipe.with_behaviour(
        offload_copies_overlap=False)})
    assert O.optimizer_offload_s(serial, 0, 1e9, 1.0) == pytest.approx(
        0.0625 + 0.390625 + 0.03125)
    piped = job.model_copy(update={"recipe": job.recipe.with_behaviour(
        offload_copies_overlap=True)})
    assert O.optimizer_offload_s(piped, 0, 1e9, 1.0) == pytest.approx(0.390625)
    assert O.overlaps_optimizer_copies(job) and not O.overlaps_optimizer_copies(serial)
    fsdp = _job(recipe="torchtitan-fsdp")
    assert not O.overlaps_optimizer_copies(fsdp)
    # no offload: the flag costs nothing
    assert O.optimizer_offload_s(serial, 0, 1e9, 0.0) == 0.0


def test_cpu_adam_on_few_threads_by_hand() -> None:
    """A host stating one core's bandwidth caps the CPU step at threads x that: 1e9
    parameters x 30 B at 10 GB/s (torchrun's one thread) = 3 s, at 4 threads 40 GB/s = 0.75 s,
    at 16 threads the node share 76.8 GB/s binds again (390.625 ms). Never faster than the
    share-only time; a host without the figure keeps it. The Megatron pipeline's max is then the
    CPU step (3 s against 62.5 / 31.25 ms of copies)."""
    host = HostSpec(link_gbps=64.0, memory_gib=2048.0, memory_gbps=614.4, core_stream_gbps=10.0)
    one = _job(host)
    assert O.cpu_adam_bytes_per_s(one, 0) == pytest.approx(10e9)
    assert O.cpu_adam_s(one, 0, 1e9) == pytest.approx(3.0)
    assert O.optimizer_offload_s(one, 0, 1e9, 1.0) == pytest.approx(3.0)
    share_only = O.cpu_adam_s(_job(), 0, 1e9)
    assert share_only == pytest.approx(0.390625)
    for threads, want in ((4, 0.75), (16, 0.390625)):
        base = RECIPES["megatron-bf16"]
        rec = base.model_copy(update={"behaviour": base.behaviour.model_copy(
            update={"cpu_optimizer_threads": threads})})
        job = one.model_copy(update={"recipe": rec})
        assert O.cpu_adam_s(job, 0, 1e9) == pytest.approx(want)
        assert O.cpu_adam_s(job, 0, 1e9) >= share_only * (1 - 1e-12)
    with pytest.raises(ValueError):
        HostSpec(link_gbps=64.0, memory_gib=2048.0, memory_gbps=614.4, core_stream_gbps=0.0)
    with pytest.raises(ValueError):
        RECIPES["megatron-bf16"].behaviour.model_validate({"cpu_optimizer_threads": 0})


def test_deepspeed_launcher_threads_by_hand() -> None:
    """DeepSpeed's launcher leaves OMP_NUM_THREADS unset (launch.py:230-232 @38327e07), so the
    `deepspeed` preset's DeepSpeedCPUAdam runs one OpenMP thread per CPU ("all") and is not
    capped: 1e9 x 30 B at the 76.8 GB/s share = 390.625 ms even where one core streams only
    10 GB/s, against 3 s for torchrun's one thread (megatron-bf16, or deepspeed under
    torchrun: threads=1). With --bind_cores_to_rank on a DGX H100 (112 cores // 8 = 14
    threads) 140 GB/s > 76.8 GB/s: the share binds again. Strings other than "all" refuse."""
    host = HostSpec(link_gbps=64.0, memory_gib=2048.0, memory_gbps=614.4, core_stream_gbps=10.0)
    ds = RECIPES["deepspeed"]
    assert ds.behaviour.cpu_optimizer_threads == "all"
    assert O.cpu_adam_s(_job(host, "deepspeed"), 0, 1e9) == pytest.approx(0.390625)
    assert O.cpu_adam_s(_job(host), 0, 1e9) == pytest.approx(3.0)
    for threads, want in ((1, 3.0), (14, 0.390625)):
        rec = ds.model_copy(update={"behaviour": ds.behaviour.model_copy(
            update={"cpu_optimizer_threads": threads})})
        job = _job(host, "deepspeed").model_copy(update={"recipe": rec})
        assert O.cpu_adam_s(job, 0, 1e9) == pytest.approx(want)
    # without the host figure every recipe runs at the share, whatever its threads
    assert O.cpu_adam_s(_job(recipe="deepspeed"), 0, 1e9) == pytest.approx(0.390625)
    assert ds.behaviour.model_validate({"cpu_optimizer_threads": "all"}).cpu_optimizer_threads \
        == "all"
    with pytest.raises(ValueError):
        ds.behaviour.model_validate({"cpu_optimizer_threads": "some"})


def test_dgx_h100_preset_cpu_adam_by_hand() -> None:
    """The DGX H100 preset states no one-core figure (no public one-thread STREAM result for
    the Xeon Platinum 8480C was found), so its CPU Adam runs at the DRAM share: 2 sockets x 8
    DDR5-4800 channels x 38.4 GB/s = 614.4 GB/s over 8 GPUs = 76.8 GB/s, and the offload
    card's 1.91e9 parameters per process x 30 B take 1.91e9 x 30 / 76.8e9 = 746.1 ms."""
    host = load_cluster("dgx-h100").node_groups[0].host
    assert host is not None and host.core_stream_gbps is None
    job = _job(host)
    assert O.cpu_adam_bytes_per_s(job, 0) == pytest.approx(76.8e9)
    assert O.cpu_adam_s(job, 0, 1.91e9) == pytest.approx(1.91e9 * 30 / 76.8e9)
    assert O.cpu_adam_s(job, 0, 1.91e9) == pytest.approx(0.74609375)


def test_activation_copy_exposure_by_hand() -> None:
    """6.4 GB per micro-batch = 100 ms each way at 64 GB/s: against a 60 ms forward and a
    120 ms backward, 40 ms sticks out of the forward and none out of the backward."""
    job = _job()
    assert O.activation_offload_s(job, 0, 6.4e9, 0.06, 0.12) == pytest.approx(0.04)
    assert O.activation_offload_s(job, 0, 0.0, 0.06, 0.12) == 0.0
    assert O.offloaded_activations(3, [(2, 10.0), (2, 30.0)]) == (60.0, 20.0)
    assert O.offloaded_activations(9, [(2, 10.0), (2, 30.0)]) == (80.0, 20.0)


def test_optimizer_offload_moves_bytes_and_time() -> None:
    job = _job()
    base = dict(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8)
    m0 = stage_memory(job, Plan(**base))
    m1 = stage_memory(job, Plan(**base, optimizer_offload=0.25))
    t0 = step_time(job, Plan(**base))
    t1 = step_time(job, Plan(**base, optimizer_offload=0.25))
    for a, b, s0, s1 in zip(m0, m1, t0.stages, t1.stages, strict=True):
        assert b.optimizer_bytes == pytest.approx(0.75 * a.optimizer_bytes)
        params = a.params_bytes / 2.0  # bf16 weights, zero=0: every parameter updated here
        assert b.host_bytes == pytest.approx(0.25 * (a.optimizer_bytes + 4.0 * params))
        assert s1.optimizer_s == pytest.approx(
            0.75 * s0.optimizer_s + O.optimizer_offload_s(job, 0, params, 0.25))


def test_gpu_kept_master_saves_only_the_moments() -> None:
    """Behaviour offload_gpu_master (Megatron-Core without the precision-aware optimizer): of
    Adam's 12 optimizer bytes per parameter (fp32 master 4 + moments 8) the offloaded share
    frees only the moments, 8/12, the host bytes stay, and the H2D moves the 4-byte master
    instead of the 2-byte weight: 1e9 parameters serial 62.5 + 390.625 + 62.5 ms."""
    job = _job()
    kept = job.model_copy(update={"recipe": job.recipe.with_behaviour(
        offload_gpu_master=True, offload_copies_overlap=False)})
    assert O.gpu_kept_optimizer_share(job.recipe) == 0.0
    assert O.gpu_kept_optimizer_share(kept.recipe) == pytest.approx(4 / 12)
    assert O.optimizer_offload_s(kept, 0, 1e9, 1.0) == pytest.approx(0.0625 + 0.390625 + 0.0625)
    base = dict(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8)
    m0 = stage_memory(kept, Plan(**base))
    m1 = stage_memory(kept, Plan(**base, optimizer_offload=0.75))
    d1 = stage_memory(job, Plan(**base, optimizer_offload=0.75))
    for a, b, d in zip(m0, m1, d1, strict=True):
        assert b.optimizer_bytes == pytest.approx(a.optimizer_bytes * (1 - 0.75 * 8 / 12))
        assert d.optimizer_bytes == pytest.approx(a.optimizer_bytes * 0.25)
        assert b.host_bytes == pytest.approx(d.host_bytes)


def test_activation_offload_memory() -> None:
    """4 of 8 layers per stage offload: the stage keeps the other 4 layers per in-flight
    micro-batch, one offloaded layer in transit; the host holds 4 layers per micro-batch."""
    job = _job()
    base = dict(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8)
    a = stage_memory(job, Plan(**base))[1]  # last stage: 1 in flight
    b = stage_memory(job, Plan(**base, activation_offload=4))[1]
    per_layer = b.host_bytes / 4
    assert b.activations_bytes == pytest.approx(a.activations_bytes - 4 * per_layer
                                                + per_layer)
    first = stage_memory(job, Plan(**base, activation_offload=4))[0]
    assert first.host_bytes == pytest.approx(2 * 4 * per_layer)  # 2 in flight on stage 0


def test_host_memory_limits_the_plan() -> None:
    small = HostSpec(link_gbps=64.0, memory_gib=1.0, memory_gbps=614.4)
    p = Plan(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8, optimizer_offload=1.0)
    assert evaluate(_job(), p).fits
    assert not evaluate(_job(host=small), p).fits


def test_offload_rules() -> None:
    base = dict(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8)
    assert any("host link" in v for v in plan_violations(
        _job(host=None), Plan(**base, optimizer_offload=0.5)))
    assert plan_violations(_job(host=None), Plan(**base)) == []
    assert any("exceeds the smallest stage" in v for v in plan_violations(
        _job(), Plan(**base, activation_offload=9)))


@pytest.mark.parametrize(("name", "link"), [("dgx-h100", 64.0), ("dgx-h200", 64.0),
                                            ("dgx-h800", 64.0), ("dgx-a100", 32.0),
                                            ("dgx-b200", 64.0)])
def test_presets_state_their_host(name: str, link: float) -> None:
    host = load_cluster(name).node_groups[0].host
    assert host is not None and host.link_gbps == link and host.source


def test_csv_row_carries_the_new_fields() -> None:
    from autoparallel_cp.outputs import CSV_COLUMNS, csv_row

    job = _job()
    p = Plan(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8, schedule="zb-h1",
             optimizer_offload=0.5, activation_offload=2)
    row = csv_row(evaluate(job, p).to_json(), 1)
    assert (row["schedule"], row["optimizer_offload"], row["activation_offload"]) == (
        "zb-h1", 0.5, 2)
    assert CSV_COLUMNS[-4:] == ("schedule", "optimizer_offload", "activation_offload",
                                "offload_s")
    old = csv_row(evaluate(job, Plan(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8)).to_json(), 1)
    assert old["schedule"] is None and old["offload_s"] is None


def test_breakdown_still_sums_to_the_step() -> None:
    """INTERFACE.md: the time parts sum to step_s; exposed activation copies are `offload_s`."""
    job = _job()
    # a slow host link so that the copies stick out of the compute
    slow = _job(host=HostSpec(link_gbps=0.5, memory_gib=2048.0, memory_gbps=614.4))
    for j in (job, slow):
        t = evaluate(j, Plan(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8,
                             activation_offload=4, optimizer_offload=0.5)).time
        parts = (t.compute_s + t.bubble_s + t.tp_comm_s + t.cp_comm_s + t.ep_comm_s
                 + t.pp_comm_s + t.dp_comm_s + t.optimizer_s + t.fixed_s + t.offload_s)
        assert parts == pytest.approx(t.step_s)
    assert evaluate(slow, Plan(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8,
                               activation_offload=4)).time.offload_s > 0


def test_json_reports_the_host_bytes() -> None:
    job = _job()
    base = dict(dp=2, tp=4, pp=2, mbs=1, num_microbatches=8)
    d = evaluate(job, Plan(**base, optimizer_offload=1.0)).to_json()
    want = max(s.host_bytes for s in stage_memory(job, Plan(**base, optimizer_offload=1.0)))
    assert d["memory"]["host_bytes"] == pytest.approx(want) and want > 0
    assert evaluate(job, Plan(**base)).to_json()["memory"]["host_bytes"] == 0.0
