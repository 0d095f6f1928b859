"""Request workloads: Mooncake traces and synthetic generators (used by sim/ and bench/)."""
