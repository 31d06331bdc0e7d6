"""autoparallel_cp: optimal parallel training plans with OR-Tools CP-SAT."""
__version__ = "0.1.0"
