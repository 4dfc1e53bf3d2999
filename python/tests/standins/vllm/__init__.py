"""Stand-in of the `vllm` package for kvpool's connector tests.

Written from ENGINES.md §2 and §4.3: the modules a KV connector imports, under
vLLM's own dotted names, plus a small engine (scheduler, model runner, engine
core) that drives a connector through vLLM's per-step call sequence. The
parent packages are empty so nothing heavy runs on import, as with the
stubbing technique of ENGINES.md §4.
"""
