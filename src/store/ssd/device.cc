#include "store/ssd/device.h"

namespace kvpool {

Status Device::WriteV(uint64_t offset, std::span<const Piece> pieces) {
  for (const Piece& p : pieces) {
    KVPOOL_RETURN_IF_ERROR(Write(offset, p.buf, p.len));
    offset += p.len;
  }
  return Status::Ok();
}

}  // namespace kvpool
