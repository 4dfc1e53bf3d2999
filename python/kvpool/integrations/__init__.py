"""Engine connectors: sglang (HiCache L3 storage), vllm (KV connector V1),
lmcache (remote connector). Each imports its engine's modules on import, so
import only the one you use."""
