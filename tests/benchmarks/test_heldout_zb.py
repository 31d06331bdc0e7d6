"""The Zero Bubble paper's rows (source zero-bubble-iclr24, harness/heldout_zb.py): each runs the
schedule its table names, with the launch script's settings, and the cost model orders the
schedules of one job as the paper measured them (issue 31: zero-bubble runs in the corpus)."""

from __future__ import annotations

import itertools

import pytest
from harness import heldout_zb as zb
from harness.heldout import heldout_rows

from autoparallel_cp.cost.evaluate import evaluate


@pytest.fixture(scope="module")
def rows() -> list:
    return [h for h in heldout_rows() if h.source == zb.SOURCE]


def test_rows_run_the_papers_schedules_and_script_settings(rows: list) -> None:
    """Table 4's 48 runs and Table 12's 18 are evaluated: pure pipeline (tp 1, dp 1, pp = the
    GPUs), 1F1B / ZB-1p / ZB-2p / 1F1B-I as default / zb-h1 / zb-h2 / interleaved, the first and
    last stage one layer fewer, fp16 gradient buffers, no flash attention, dropout, no
    recompute; Table 6's 9 ZB-V runs with the fork's layout, rank 0 without layers (spec/plan.py
    `empty_first_ok`)."""
    done = [h for h in rows if h.plan is not None]
    assert len(done) == 75 and len(rows) == 75
    for h in done:
        assert (h.plan.tp, h.plan.dp, h.plan.pp) == (1, 1, h.job.cluster.num_gpus)
        assert h.plan.recompute == "none" and h.plan.zero == 0
        assert h.job.recipe.grad_bytes == 2 and h.job.recipe.flash_attention is False
        assert h.options.dropout is True
        sl = h.plan.layers_per_stage(h.job.model.num_layers)
        if h.plan.pipeline_schedule == "zbv":  # 2pp - 2 layers: rank 0 empty, 2 elsewhere
            assert sl == (0,) + (2,) * (h.plan.pp - 1)
            continue
        assert sl[0] == sl[-1] == max(sl) - 1
    got = {h.plan.pipeline_schedule for h in done}
    assert got == {"1f1b", "zb-h1", "zb-h2", "interleaved", "zbv"}
    for h in done:
        if h.plan.pipeline_schedule == "interleaved":  # one layer per chunk, padding empties 2
            cl = h.plan.chunk_layers
            assert cl[0] == cl[-1] == 0 and set(cl[1:-1]) == {1}
            assert len(cl) == h.plan.pp * h.plan.vpp and h.options.overlap_p2p_comm


def test_zbv_layout_is_the_forks_padding() -> None:
    """Hand-derived from the fork's get_offset: layers padded to chunks of ceil(L/2pp), one
    fewer on stage indices -1, 0, ... (the padding), stage s on rank s or 2pp-1-s."""
    r = {"source_id": zb.SOURCE, "extra_config": "schedule=ZB-V (...)"}
    # 30 layers on 16 ranks: 32 chunks of 1, stages 0 and 31 (both rank 0) empty
    assert zb.chunk_layers(r, 30, 16, 2) == (0,) + (1,) * 15 + (0,) + (1,) * 15
    # 62 layers on 8 ranks: 16 chunks of 4, stages 0 and 15 hold 3 (rank 0's two chunks)
    assert zb.chunk_layers(r, 62, 8, 2) == (3,) + (4,) * 7 + (3,) + (4,) * 7
    # 60 layers on 8 ranks: 4 padding slots, stages 15, 0, 1, 2 -> ranks 0, 0, 1, 2
    assert zb.chunk_layers(r, 60, 8, 2) == (3, 3, 3) + (4,) * 5 + (3,) + (4,) * 7
    assert zb.chunk_layers(r, 30, 16, 1) is None
    # interleaved (model chunk v*pp + j on rank j): 22 layers on 8 ranks x 3 chunks
    r_i = {"source_id": zb.SOURCE, "extra_config": "schedule=1F1B-I (...)"}
    assert zb.chunk_layers(r_i, 22, 8, 3) == (0,) + (1,) * 22 + (0,)
    # 62 layers on 8 ranks x 2 chunks of 4: model chunks 15 (rank 7) and 0 (rank 0) hold 3
    assert zb.chunk_layers(r_i, 62, 8, 2) == (3,) + (4,) * 14 + (3,)
    assert zb.chunk_layers({"source_id": "other"}, 30, 16, 2) is None


def test_schedules_of_one_job_ranked_as_measured(rows: list) -> None:
    """Per model and micro-batch count, the paper measured ZB-2p > ZB-1p > 1F1B (Table 4);
    the cost model orders each such pair the same way or calls them equal within 1%, and
    predicts ZB-1p's gain over 1F1B within 4.5 points of the measured one (+4.2..+15.0%): the
    split of the cost model's per-op times (cost/pass_split.py; the FLOP split's W = F put
    it 1.7-6 points too high, RESULTS.md 'Zero-bubble and offload runs'; 4 points before the
    tied embedding all-reduce, exposed under 1F1B only, widened the gain by up to 0.5)."""
    done = [h for h in rows if h.plan is not None and h.plan.num_microbatches >= 2 * h.plan.pp
            and h.plan.pipeline_schedule != "zbv"]  # Table 6's ZB-V: the test below
    jobs = {(h.name, h.plan.num_microbatches) for h in done}
    assert len(jobs) == 12  # Table 4 (m >= 3p); Table 12's m <= p: the test below
    for name, m in jobs:
        runs = {h.plan.pipeline_schedule: h for h in done
                if (h.name, h.plan.num_microbatches) == (name, m)}
        pred = {s: evaluate(h.job, h.plan, h.options).throughput.tokens_per_s_per_gpu
                for s, h in runs.items()}
        meas = {s: h.measured_tps for s, h in runs.items()}
        for lo, hi in itertools.pairwise(("1f1b", "zb-h1", "zb-h2")):
            assert meas[hi] > meas[lo], (name, m, lo, hi)
            assert pred[hi] > pred[lo] * 0.99, (name, m, lo, hi, pred)
        gain = pred["zb-h1"] / pred["1f1b"] - meas["zb-h1"] / meas["1f1b"]
        assert abs(gain) < 0.045, (name, m, gain, pred)


def test_zbv_ranked_against_zb_1p_and_2p_as_measured(rows: list) -> None:
    """Table 6: on the 28.3B model (32 GPUs, m = 96 / 128 / 256) ZB-V ran faster than ZB-1p
    (+10..+16%) and ZB-2p (+2..+6%); with rank 0 empty (the fork's layout) the cost model
    orders each pair the same way (+3.7..+5.8% and +3.2..+4.4%: the gain over ZB-1p about a
    third of the measured one, RESULTS.md 'A V's empty first rank')."""
    v = [h for h in rows if h.plan is not None and h.plan.pipeline_schedule == "zbv"]
    assert len(v) == 9
    pairs = 0
    for h in v:
        assert h.plan.layers_per_stage(h.job.model.num_layers)[0] == 0
        pv = evaluate(h.job, h.plan, h.options).throughput.tokens_per_s_per_gpu
        for o in rows:
            if (o.plan is None or (o.name, o.plan.num_microbatches, o.plan.pp) != (
                    h.name, h.plan.num_microbatches, h.plan.pp)
                    or o.plan.pipeline_schedule not in ("zb-h1", "zb-h2")):
                continue
            po = evaluate(o.job, o.plan, o.options).throughput.tokens_per_s_per_gpu
            assert h.measured_tps > o.measured_tps and pv > po, (h.name, o.plan.schedule)
            pairs += 1
    assert pairs == 6


def test_few_microbatches_gain_as_measured(rows: list) -> None:
    """Table 12 (m <= p, Appendix H): ZB-2p measured +19..+33% over 1F1B; with the bubble of
    m micro-batches (cost/schedules.py `bubble_ratio`: (p-1)(F+B) - (m-1)W and the replay's
    other paths) the predicted gain is within 12 points of it (it was +47..+100% with the
    m-blind ratio; 10 points before the tied embedding all-reduce, cost/tied_embedding_sync.py,
    charged under the fork's 1F1B only, widened the gain by up to 1.6 points)."""
    few = [h for h in rows if h.plan is not None and h.plan.num_microbatches <= h.plan.pp]
    jobs = {(h.name, h.plan.num_microbatches) for h in few}
    assert len(jobs) == 9
    for name, m in jobs:
        runs = {h.plan.pipeline_schedule: h for h in few
                if (h.name, h.plan.num_microbatches) == (name, m)}
        pred = {s: evaluate(h.job, h.plan, h.options).throughput.tokens_per_s_per_gpu
                for s, h in runs.items()}
        meas = {s: h.measured_tps for s, h in runs.items()}
        gain = pred["zb-h2"] / pred["1f1b"] - meas["zb-h2"] / meas["1f1b"]
        assert meas["zb-h2"] > meas["1f1b"] and abs(gain) < 0.12, (name, m, gain)


def test_unknown_schedule_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="schedule="):
        zb.schedule({"source_id": zb.SOURCE, "extra_config": "schedule=ZB-9q", "model": "x"})


#: Qi et al. Appendix D Table 9, the 24/48/96-micro-batch rows: profiled T_F, T_B, T_W (ms)
TABLE_9 = {"1.5B": (18.522, 18.086, 9.337), "6.2B": (29.718, 29.444, 19.927),
           "14.6B": (11.347, 11.248, 8.132), "28.3B": (10.419, 10.207, 7.715)}


def test_split_against_the_papers_profile(rows: list) -> None:
    """cost/pass_split.py's F, B, W of the paper's four models against Table 9 (compared, not
    fitted): W/F rises with the model as profiled (0.66 / 0.85 / 0.96 / 1.00 against 0.50 /
    0.67 / 0.72 / 0.74; the FLOP count gives 1 for all), each within 0.3 of the profile, and
    B is the longest pass (B/F 1.14-1.26 against ~0.98: the model's forward has less non-GEMM
    time than the fp16 runs; RESULTS.md 'Zero-bubble and offload runs')."""
    from autoparallel_cp.cost.pass_split import pass_times

    got: dict[str, float] = {}
    for h in rows:
        size = h.name.split()[1]
        if h.plan is None or h.plan.pipeline_schedule != "zb-h1" or size in got:
            continue
        f, b, w = pass_times(h.job, h.plan, h.options)
        got[size] = w / f
        t_f, _, t_w = TABLE_9[size]
        assert abs(w / f - t_w / t_f) < 0.3 and b > f > w * 0.95, (size, f, b, w)
    order = sorted(TABLE_9, key=lambda s: TABLE_9[s][2] / TABLE_9[s][0])
    assert sorted(got, key=got.__getitem__) == order
