"""The statistics behind a report: spike detection (`spikes`), the explanation of a spike by
stage, dimension and counterfactual (`explain`), and sampling weights with their checks
(`sampling`). They read frames the engine produced and never open a store themselves.
"""
