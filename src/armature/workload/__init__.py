"""Request workloads: Mooncake traces and synthetic generators, and how their results are
measured (percentiles, SLOs, goodput). Used by sim/ and bench/."""
