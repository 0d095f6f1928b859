"""Build the optional native extensions; everything else is in pyproject.toml.

- armature.kv._native: block hashing (armature.kv.hashing).
- armature.kv._pool: the KV block pool's per-block state (armature.kv.block_pool).
- armature.router._index: the prefix index's holder table (armature.router.holder_store),
  whose token walk hashes blocks with the same code (armature/kv/xxh3.h, included by both).
- armature.router._routed: the kv policy's routed-prefix index (armature.router.routed_index).
- armature.workload._synth: synthetic prompt tokens (armature.workload.traces).

Without a C compiler the build skips them (optional=True) and the modules fall back to pure
Python, which gives the same results, several times slower.
"""

from setuptools import Extension, setup

C_FLAGS = ["-O3", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]
# no fused multiply-adds: float results round as their Python references' do
STRICT_FLOATS = [*C_FLAGS, "-ffp-contract=off"]

setup(
    ext_modules=[
        Extension(
            "armature.kv._native",
            ["src/armature/kv/_native.c"],
            depends=[
                "src/armature/kv/xxh3.h",
                "src/armature/kv/pyint.h",
                "src/armature/kv/token_blocks.h",
            ],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "armature.kv._pool",
            ["src/armature/kv/_pool.c"],
            depends=[
                "src/armature/kv/pyint.h",
                "src/armature/kv/xxh3.h",
                "src/armature/kv/pool_decode.h",
                "src/armature/kv/token_blocks.h",
            ],
            extra_compile_args=STRICT_FLOATS,
            optional=True,
        ),
        Extension(
            "armature.router._index",
            ["src/armature/router/_index.c"],
            depends=[
                "src/armature/kv/xxh3.h",
                "src/armature/kv/pyint.h",
                "src/armature/kv/bigmem.h",
            ],
            extra_compile_args=STRICT_FLOATS,
            optional=True,
        ),
        Extension(
            "armature.router._routed",
            ["src/armature/router/_routed.c"],
            depends=["src/armature/kv/pyint.h", "src/armature/kv/bigmem.h"],
            extra_compile_args=C_FLAGS,
            optional=True,
        ),
        Extension(
            "armature.workload._synth",
            ["src/armature/workload/_synth.c"],
            depends=["src/armature/kv/pyint.h"],
            extra_compile_args=C_FLAGS,
            optional=True,
        ),
    ]
)
