"""Several jobs' collectives planned together on one shared cluster (plan.py says how)."""

OBJECTIVES = ("weighted", "fair")  # weighted: least weighted sum of the jobs' times; fair: max-min (alone / shared)
