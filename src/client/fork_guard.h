// ForkGuard: what a child of fork() must not touch of its parent's clients.
//
// A client's connections to the node and its mappings of the node's
// segment and of its staging areas are registered here. In the child of a
// fork() (pthread_atfork), every registered connection is closed and every
// registered mapping unmapped before the child runs on, and
// ForkGeneration() changes; each client compares it at its next call and
// then opens connections of its own (or fails, as its options ask) without
// touching the parent's (client.cc). So parent and child never share a
// socket or a request-id sequence, and the child never writes into the
// parent's staging areas. The parent is not affected.
//
// Thread-safe. The registry's lock is taken around fork() (prepare, then
// released in parent and child), so no fork happens while it changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace kvpool::client {

// Changes in the child of every fork() (0 in a process that never forked).
uint64_t ForkGeneration();

// A connection's socket, closed in a forked child: made and registered,
// and unregistered and closed, each under the registry's lock, so no fork
// between the two steps leaves the child a copy of the parent's socket.
int OpenForkSafeSocket(int domain, int type, int protocol);
void CloseForkSafe(int fd);
// A mapping, unmapped in a forked child. Unregister before unmapping.
void RegisterForkMapping(void* base, size_t size);
void UnregisterForkMapping(void* base);

// Serialises a child's replacement of its clients' backends; never held
// across fork() (taken by the prepare handler).
std::mutex& ForkReopenMutex();

}  // namespace kvpool::client
