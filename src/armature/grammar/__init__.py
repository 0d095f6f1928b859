"""Structured output's grammars (llguidance): a `Guide` compiled to a grammar and checked
(compile.py), the model's tokenizer as llguidance reads it (tokenizer.py), and the matcher
that follows one request's tokens (matcher.py). No torch, no I/O beyond reading the tokenizer."""
