"""`armature profile`: one engine alone, swept over prefill and decode work, written as a
timing profile (`armature.protocols.timing_profile`) that the mocker can run from.

    plan.py    pure: which points a sweep measures, and whether the engine can run them
    points.py  pure: a sweep point's request timings -> a profile point (medians, tokens/s)
    sweep.py   async: drives any `Engine` through `generate` and times its requests
    plots.py   PNG plots of a profile (matplotlib, headless)
    run.py     the shell: builds the engine from the registry, sweeps, writes file and plots
"""
