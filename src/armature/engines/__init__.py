"""Engines behind one contract (`api.Engine`), built by name through the registry
(`registry.KINDS`): `native/` (our PyTorch engine; the mocker is its core with a timing
model, in sim/) and `vllm/` (an adapter over vLLM)."""
