// PrefetchForRead: asks the CPU to start loading the cache line holding an
// address, so that a read of it a little later does not wait for memory.
// Never faults (any address may be given) and changes nothing else.
//
// GCC 12 at -O2 deletes __builtin_prefetch calls in some loops (its dead
// code elimination treats them as having no effect), so on x86-64 the
// instruction is written out.
#pragma once

namespace kvpool {

inline void PrefetchForRead(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

}  // namespace kvpool
