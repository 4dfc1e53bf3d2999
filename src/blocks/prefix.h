// PrefixAnswer: which nodes hold the longest leading run of a request's
// engine blocks, and in which tier -- what a router asks before it places
// a request (cluster/block_index.h answers it for the cluster; a
// standalone node from its own DescriptorTable).
//
// Plain values and a pure function; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvpool::blocks {

// Tier bits of one block on one node (DescriptorTable::Tiers).
inline constexpr uint8_t kTierDram = 1;
inline constexpr uint8_t kTierSsd = 2;

struct PrefixHolder {
  std::string node_id;
  std::string address;  // the node's peer address ("" standalone)
  // Leading blocks of the request the node holds: each in DRAM, or only
  // on SSD (promoted into DRAM when read).
  uint32_t blocks = 0;
  uint32_t dram = 0;
  uint32_t ssd = 0;
  // Per leading block held, kTierDram and/or kTierSsd.
  std::vector<uint8_t> tiers;
};

struct PrefixAnswer {
  uint32_t asked = 0;    // blocks in the request
  uint32_t longest = 0;  // the longest leading run any node holds
  // Nodes holding at least the first block, longest run first (then by
  // node id).
  std::vector<PrefixHolder> holders;
  // Homes of the index asked, and those that did not answer in time (their
  // blocks count as held nowhere).
  uint32_t homes = 0;
  uint32_t homes_failed = 0;
};

// The answer from each node's tier bits per block: tiers[n][i] for node n
// and block i of the request (0: not held).
PrefixAnswer BuildPrefixAnswer(uint32_t asked,
                               std::vector<std::pair<PrefixHolder, std::vector<uint8_t>>> nodes);

}  // namespace kvpool::blocks
