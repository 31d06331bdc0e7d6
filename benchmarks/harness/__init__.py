"""The validation harness: published runs to jobs and plans, and the statistics over them.

Imported as the top-level package `harness` (the scripts in `benchmarks/` run with their own
folder on `sys.path`; tests put it there). Imports go one way, each layer only from the ones
above it (tests/architecture/test_benchmarks_layering.py checks this and the 600-line limit):

1. `tuned` (the constants chosen on end-to-end rows), `corpus` (hardware, links and recipes the
   sources state), `heldout_automodel` (NeMo AutoModel's settings), `ablation` (pairs of
   runs of one job that differ in one choice, and the ranking on them), `h200_kit` (the torch
   code the H200 measurement scripts run on a lent GPU: never imported by the tool or tests);
2. `train_rows` (published_runs_train.csv and the H200 measurements); the held-out readers,
   split by concern: `heldout_common` < `heldout_bridge`, `heldout_stated`, `heldout_megatron`
   < `heldout_models` < `heldout_recipes` < `heldout` (`heldout_rows`, published_runs_heldout);
3. `crossval` (the corpus of cases, leave-one-source-out);
4. the scripts in `benchmarks/` (validate.py, intervals.py, ...): entry points, imported by
   nothing in the harness.
"""
