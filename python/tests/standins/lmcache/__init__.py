"""Test stand-in of the `lmcache` package (see ENGINES.md §3, §4.4).

Only the modules the kvpool connector touches, at LMCache's own module paths,
written from ENGINES.md. The real package cannot be installed here (no PyPI,
and its `lmcache/utils.py` needs float8 dtypes that torch 1.13 lacks).

Two releases: the 2025 remote connector contract (§3) by default, the 2026
one (§6.2) with env KVPOOL_LMCACHE_CONTRACT=2026 (see `_contract`).
"""
