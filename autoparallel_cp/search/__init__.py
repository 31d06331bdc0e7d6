"""The search: plan space, integer tables from the cost model, the CP-SAT formulation (axes,
key-level master, per-key partition model), the exhaustive reference enumerator, the
infeasibility explanation and the recommendation of the simplest near-best plan.

Builds its models from `cost` numbers only: no formula lives here.
"""
