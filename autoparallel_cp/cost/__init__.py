"""The cost model: pure functions from a job and a plan to memory per GPU and step time.

FLOPs (`flops`), kernel efficiency (`efficiency`), collectives (`comm`), the factor functions
(one concern per module, gathered by `factors`, the contract with the search), their composition
into stage memory (`memory`) and step time (`steptime`), and the exact `evaluate` of one plan.
Imports only `spec` and `errors`: no solver code lives here.
"""
