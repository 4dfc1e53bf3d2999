"""Stand-in of vllm/v1/core/kv_cache_manager.py: KVCacheBlocks."""

from dataclasses import dataclass


@dataclass
class KVCacheBlock:
    block_id: int
    block_hash: object = None


@dataclass
class KVCacheBlocks:
    # One list of blocks per KV-cache group.
    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks)))
