#include "blocks/prefix.h"

#include <algorithm>

namespace kvpool::blocks {

PrefixAnswer BuildPrefixAnswer(uint32_t asked,
                               std::vector<std::pair<PrefixHolder, std::vector<uint8_t>>> nodes) {
  PrefixAnswer a;
  a.asked = asked;
  for (auto& [holder, tiers] : nodes) {
    uint32_t i = 0;
    while (i < asked && i < tiers.size() && tiers[i] != 0) {
      if ((tiers[i] & kTierDram) != 0) {
        ++holder.dram;
      } else {
        ++holder.ssd;
      }
      ++i;
    }
    if (i == 0) continue;
    holder.blocks = i;
    holder.tiers.assign(tiers.begin(), tiers.begin() + i);
    a.longest = std::max(a.longest, i);
    a.holders.push_back(std::move(holder));
  }
  std::sort(a.holders.begin(), a.holders.end(), [](const PrefixHolder& x, const PrefixHolder& y) {
    return x.blocks != y.blocks ? x.blocks > y.blocks : x.node_id < y.node_id;
  });
  return a;
}

}  // namespace kvpool::blocks
