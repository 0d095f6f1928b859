"""`armature configure`: recommend a deployment (aggregated or disaggregated, P:D ratio,
tensor parallelism, batch limits, replicas) for a model, a hardware system and latency
targets, by prediction instead of measurement.

    model_spec  config.json -> ModelSpec (parameters, weight and KV bytes)
    systems     hardware profiles (systems/*.json, each number with its source)
    operators   the operator model: one step's time from GEMMs, attention, all-reduce
    memory      the memory-fit rule: weights / TP + KV for the batch + headroom <= capacity
    timing      a step-time model per worker shape, as a timing profile the mocker runs
    space       the deployments: agg / disagg, P:D, TP, max-num-seqs, max-num-batched-tokens
    estimate    the fast analytic estimate of one deployment at one operating point
    simulate    the finalists through `armature replay`'s simulator on the same step times
    search      prune, estimate, simulate, rank
    outputs     the table, the Pareto plot, and the --save-dir files
"""
