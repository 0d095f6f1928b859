"""Build the optional native block-hashing extension; everything else is in pyproject.toml.

Without a C compiler the build skips it (optional=True) and armature.kv.hashing falls back to
pure Python, which gives the same hashes, several times slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "armature.kv._native",
            ["src/armature/kv/_native.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
