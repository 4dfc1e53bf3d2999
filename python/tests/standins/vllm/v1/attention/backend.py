"""Stand-in of vllm/v1/attention/backend.py (vllm.attention.backends.abstract before v0.12)."""


class AttentionMetadata:
    pass


class AttentionBackend:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                           cache_dtype_str="auto"):
        raise NotImplementedError

    @staticmethod
    def get_kv_cache_stride_order():
        raise NotImplementedError
