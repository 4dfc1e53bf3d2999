"""Which LMCache release the stand-ins imitate, read once when `lmcache` is
first imported: env KVPOOL_LMCACHE_CONTRACT, `2025` (default; ENGINES.md §3)
or `2026` (ENGINES.md §6.2). A test that needs both drops every `lmcache*`
module from sys.modules, sets the variable and imports again."""
import os

CONTRACT = os.environ.get("KVPOOL_LMCACHE_CONTRACT", "2025")
if CONTRACT not in ("2025", "2026"):
    raise ImportError("KVPOOL_LMCACHE_CONTRACT must be 2025 or 2026, not %r" % CONTRACT)
IS_2026 = CONTRACT == "2026"
