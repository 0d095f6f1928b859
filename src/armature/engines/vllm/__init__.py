"""The vLLM engine adapter (`--engine vllm`, the optional `armature[vllm]` extra).

Imports no vLLM: `build.build_vllm_engine` does, when asked for an engine. The translation
parts (sampling, outputs, events, load) are pure and tested without vLLM.
"""
