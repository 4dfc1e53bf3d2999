"""Stand-in of SGLang's host (L2) KV pools (ENGINES.md 1.7): HostKVCache,
MHATokenToKVPoolHost, MLATokenToKVPoolHost; and the side pools of hybrid
models (ENGINES.md 6.5): SWATokenToKVPoolHost and MambaPoolHost, which a
storage backend reaches through register_mem_host_pool_v2 and copies as
flat pages (get_data_page / get_dummy_flat_data_page /
set_from_flat_data_page).

Same buffer shapes per layout, same page pointer/size math in
get_page_buffer_meta, same flat-page helpers as the engine's pools. What
differs: no device pool behind them (the constructor takes the geometry
directly), pin_memory is False (Debian's CPU torch refuses pinned memory),
sizes use element_size() (torch 1.13 has no dtype.itemsize), and alloc()
hands out whole pages in a shuffled order so host indices are not
contiguous across pages, as in a pool that has been used for a while.
"""

import abc
import random
import threading

import torch


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


class HostKVCache(abc.ABC):
    def __init__(self, size, page_size, dtype, layout, layer_num, start_layer=0, seed=0):
        self.page_size = page_size
        self.size = (size + page_size - 1) // page_size * page_size
        self.page_num = self.size // page_size
        self.dtype = dtype
        self.layout = layout
        self.layer_num = layer_num
        self.start_layer = start_layer
        self.end_layer = start_layer + layer_num - 1
        self.pin_memory = False
        self.device = "cpu"
        self.lock = threading.RLock()
        self.size_per_token = self.get_size_per_token()
        self.kv_buffer = self.init_kv_buffer()
        pages = list(range(self.page_num))
        random.Random(seed).shuffle(pages)
        self._free_pages = pages

    @abc.abstractmethod
    def get_size_per_token(self):
        raise NotImplementedError()

    @abc.abstractmethod
    def init_kv_buffer(self):
        raise NotImplementedError()

    @abc.abstractmethod
    def get_data_page(self, index, flat: bool = True):
        raise NotImplementedError()

    @abc.abstractmethod
    def get_dummy_flat_data_page(self) -> torch.Tensor:
        raise NotImplementedError()

    @abc.abstractmethod
    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        raise NotImplementedError()

    def available_size(self):
        return len(self._free_pages) * self.page_size

    def alloc(self, need_size: int):
        """Token-slot indices of need_size/page_size whole pages, or None."""
        assert need_size % self.page_size == 0, "need_size must be page-aligned"
        need_pages = need_size // self.page_size
        with self.lock:
            if need_pages > len(self._free_pages):
                return None
            pages, self._free_pages = self._free_pages[:need_pages], self._free_pages[need_pages:]
        slots = [p * self.page_size + t for p in pages for t in range(self.page_size)]
        return torch.tensor(slots, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> int:
        firsts = indices[:: self.page_size].tolist()
        with self.lock:
            self._free_pages.extend(s // self.page_size for s in firsts)
        return len(indices)


class MHATokenToKVPoolHost(HostKVCache):
    """kv_buffer: one tensor, leading dimension 2 = K/V.
    layer_first (2,L,S,H,D); page_first (2,S,L,H,D);
    page_first_direct (2,N,L,P,H,D); page_head (2,N,H,P,L,D)."""

    LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")

    def __init__(self, size, page_size, dtype, head_num, head_dim, layer_num,
                 layout="page_first", start_layer=0, seed=0):
        assert layout in self.LAYOUTS, layout
        self.head_num = head_num
        self.head_dim = head_dim
        super().__init__(size, page_size, dtype, layout, layer_num, start_layer, seed)

    def get_size_per_token(self):
        return 2 * self.head_num * self.head_dim * self.layer_num * _itemsize(self.dtype)

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    def init_kv_buffer(self):
        L, S, H, D, P = self.layer_num, self.size, self.head_num, self.head_dim, self.page_size
        N = S // P
        shape = {
            "layer_first": (2, L, S, H, D),
            "page_first": (2, S, L, H, D),
            "page_first_direct": (2, N, L, P, H, D),
            "page_head": (2, N, H, P, L, D),
        }[self.layout]
        return torch.zeros(shape, dtype=self.dtype)

    def _page_view(self, index):
        P = self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index:index + P]
        if self.layout == "page_first":
            return self.kv_buffer[:, index:index + P]
        return self.kv_buffer[:, index // P]

    def get_data_page(self, index, flat: bool = True):
        page = self._page_view(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        n = 2 * self.layer_num * self.page_size * self.head_num * self.head_dim
        return torch.zeros(n, dtype=self.dtype, pin_memory=self.pin_memory)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        view = self._page_view(index)
        view.copy_(data_page.reshape(view.shape))

    def get_page_buffer_meta(self, indices):
        """(ptr_list, size_list): K then V of each page (page-first layouts),
        K and V of each layer of each page (layer_first)."""
        assert len(indices) % self.page_size == 0
        it = _itemsize(self.dtype)
        L, S, H, D, P = self.layer_num, self.size, self.head_num, self.head_dim, self.page_size
        base = self.kv_buffer.data_ptr()
        ptr_list, size_list = [], []
        firsts = indices[::P].tolist()
        if self.layout == "layer_first":
            layer_stride = S * H * D * it
            v_offset = L * layer_stride
            for first in firsts:
                for layer in range(L):
                    k_ptr = base + layer * layer_stride + first * H * D * it
                    ptr_list += [k_ptr, k_ptr + v_offset]
                    size_list += [P * H * D * it] * 2
            return ptr_list, size_list
        v_offset = L * S * H * D * it
        page_bytes = L * P * H * D * it
        for first in firsts:
            k_ptr = base + first * L * H * D * it
            ptr_list += [k_ptr, k_ptr + v_offset]
            size_list += [page_bytes, page_bytes]
        return ptr_list, size_list


class MLATokenToKVPoolHost(HostKVCache):
    """One latent per token (C = kv_lora_rank + qk_rope_head_dim), no K/V split.
    layer_first (L,S,1,C); page_first (S,L,1,C); page_first_direct (N,L,P,1,C)."""

    LAYOUTS = ("layer_first", "page_first", "page_first_direct")

    def __init__(self, size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num,
                 layout="page_first", start_layer=0, seed=0):
        assert layout in self.LAYOUTS, layout
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        super().__init__(size, page_size, dtype, layout, layer_num, start_layer, seed)

    def get_size_per_token(self):
        return self.kv_cache_dim * self.layer_num * _itemsize(self.dtype)

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def init_kv_buffer(self):
        L, S, C, P = self.layer_num, self.size, self.kv_cache_dim, self.page_size
        shape = {
            "layer_first": (L, S, 1, C),
            "page_first": (S, L, 1, C),
            "page_first_direct": (S // P, L, P, 1, C),
        }[self.layout]
        return torch.zeros(shape, dtype=self.dtype)

    def _page_view(self, index):
        P = self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, index:index + P]
        if self.layout == "page_first":
            return self.kv_buffer[index:index + P]
        return self.kv_buffer[index // P]

    def get_data_page(self, index, flat: bool = True):
        page = self._page_view(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        n = self.layer_num * self.page_size * self.kv_cache_dim
        return torch.zeros(n, dtype=self.dtype, pin_memory=self.pin_memory)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        view = self._page_view(index)
        view.copy_(data_page.reshape(view.shape))

    def get_page_buffer_meta(self, indices):
        """(ptr_list, size_list): one entry per page (page-first layouts),
        one per layer of each page (layer_first)."""
        assert len(indices) % self.page_size == 0
        it = _itemsize(self.dtype)
        L, S, C, P = self.layer_num, self.size, self.kv_cache_dim, self.page_size
        base = self.kv_buffer.data_ptr()
        ptr_list, size_list = [], []
        firsts = indices[::P].tolist()
        if self.layout == "layer_first":
            for first in firsts:
                for layer in range(L):
                    ptr_list.append(base + (layer * S + first) * C * it)
                    size_list.append(P * C * it)
            return ptr_list, size_list
        for first in firsts:
            ptr_list.append(base + first * L * C * it)
            size_list.append(L * P * C * it)
        return ptr_list, size_list


class SWATokenToKVPoolHost(MHATokenToKVPoolHost):
    """K/V of a hybrid model's sliding-window layers: an MHA host pool over
    those layers with its own slot space (its indices are not the full-
    attention pool's). Only the pages of the last window matter to a hit
    (PoolHitPolicy.TRAILING_PAGES)."""


class MambaPoolHost:
    """Host copies of Mamba states: one slot per state, each holding every
    layer's conv state and temporal (SSM) state. A slot is one "page"
    (page_size 1): get_data_page(slot) is the slot's conv states of all
    layers, then its temporal states, flattened. Slots are handed out in a
    shuffled order, as in a pool that has been used for a while."""

    def __init__(self, size, num_layers, conv_shape, temporal_shape, dtype=torch.float32,
                 seed=0):
        self.size = size
        self.page_size = 1
        self.page_num = size
        self.num_layers = num_layers
        self.conv_shape = tuple(conv_shape)
        self.temporal_shape = tuple(temporal_shape)
        self.dtype = dtype
        self.layout = "layer_first"
        self.pin_memory = False
        self.device = "cpu"
        self.lock = threading.RLock()
        self.conv_buffer = torch.zeros((num_layers, size) + self.conv_shape, dtype=dtype)
        self.temporal_buffer = torch.zeros((num_layers, size) + self.temporal_shape, dtype=dtype)
        slots = list(range(size))
        random.Random(seed).shuffle(slots)
        self._free_slots = slots

    def _numels(self):
        conv = self.num_layers
        for d in self.conv_shape:
            conv *= d
        temporal = self.num_layers
        for d in self.temporal_shape:
            temporal *= d
        return conv, temporal

    def get_size_per_slot(self):
        return sum(self._numels()) * _itemsize(self.dtype)

    def available_size(self):
        return len(self._free_slots)

    def alloc(self, need_size: int):
        """need_size slot indices, or None."""
        with self.lock:
            if need_size > len(self._free_slots):
                return None
            slots, self._free_slots = self._free_slots[:need_size], self._free_slots[need_size:]
        return torch.tensor(slots, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> int:
        with self.lock:
            self._free_slots.extend(indices.tolist())
        return len(indices)

    def get_data_page(self, index, flat: bool = True):
        conv = self.conv_buffer[:, index]
        temporal = self.temporal_buffer[:, index]
        if not flat:
            return conv, temporal
        return torch.cat([conv.flatten(), temporal.flatten()])

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(sum(self._numels()), dtype=self.dtype, pin_memory=self.pin_memory)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        conv_n, _ = self._numels()
        conv = self.conv_buffer[:, index]
        temporal = self.temporal_buffer[:, index]
        conv.copy_(data_page[:conv_n].reshape(conv.shape))
        temporal.copy_(data_page[conv_n:].reshape(temporal.shape))
