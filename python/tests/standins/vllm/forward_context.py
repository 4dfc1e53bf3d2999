"""Stand-in of vllm/forward_context.py: ForwardContext as start_load_kv receives it."""

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ForwardContext:
    # layer name -> attention layer (with .kv_cache)
    no_compile_layers: dict[str, Any] = field(default_factory=dict)
    # layer name -> attention metadata, or None in profiling / dummy runs
    attn_metadata: Optional[dict[str, Any]] = None
    virtual_engine: int = 0
