// On-SSD layout of the SSD tier: one file per directory, a superblock, then
// `region_count` regions of `region_bytes`, each a log of packed records.
// docs/ssd-format.md describes the same layout with the recovery rules.
// All integers are little-endian; all structs are plain bytes (memcpy in and
// out). Bump kSsdFormatVersion on any change: a file of another version is
// refused at start (or wiped, with SsdOptions::wipe_other_format).
//
// File:    [Superblock, 4 KiB][region 0][region 1]...[region N-1]
// Region:  [RegionHeader, 64 B][record][record]... (records 64 B-aligned)
// Record:  [RecordHeader, 64 B][payload: value_len bytes][zero pad to 64 B]
//
// Superblock (offset 0, the rest of its 4 KiB block is zero)
//   off size field          meaning
//     0    4 magic          kSuperblockMagic "KVSB"
//     4    2 version        kSsdFormatVersion
//     6    2 reserved       0
//     8    8 region_bytes   size of each region (multiple of 4 KiB)
//    16    8 region_count   regions in this file
//    24    8 file_bytes     kSuperblockBytes + region_count * region_bytes
//    32    8 uuid_hi        random, chosen when the file is (re)initialized:
//    40    8 uuid_lo          the file's incarnation
//    48    8 ckpt_bytes     size of a valid checkpoint in <dir>/kvpool-ssd.ckpt
//                           written at clean shutdown; 0: none (set to 0 again
//                           as soon as a start has read it)
//    56    4 ckpt_crc       CRC-32C of those ckpt_bytes
//    60    4 crc            CRC-32C of bytes 0..59
//
// RegionHeader (first 64 bytes of a region)
//     0    4 magic          kRegionMagic "KVRG"
//     4    2 version        kSsdFormatVersion
//     6    2 reserved       0
//     8    8 seq            region sequence: unique and increasing across all
//                           files of the store; restart orders regions by it
//    16    8 file_offset    where this region belongs (catches misplaced data)
//    24    8 uuid_hi        the superblock's uuid (catches regions left over
//    32    8 uuid_lo          from an earlier incarnation of the file)
//    40   20 reserved       0
//    60    4 crc            CRC-32C of bytes 0..59
//
// RecordHeader (64 bytes, at a 64 B-aligned offset inside a region)
//     0    4 magic          kRecordMagic "KVRC"
//     4    2 version        kSsdFormatVersion
//     6    2 flags          0 (reserved for compression etc.)
//     8    8 key_hi         the full 128-bit key id (the index keeps only a
//    16    8 key_lo           tag; this catches tag collisions)
//    24    8 value_len      payload bytes
//    32    8 file_offset    offset of this header in the file (misplaced?)
//    40    8 region_seq     seq of the region it was written into (stale?)
//    48    4 incarnation    low 32 bits of the file uuid
//    52    4 reserved       0
//    56    4 data_crc       CRC-32C of header bytes 0..55, then the payload
//    60    4 header_crc     CRC-32C of header bytes 0..59 (scan validates
//                           headers without reading payload CRCs)
//
// Tombstone (64 bytes, no payload): a RecordHeader with magic
// kTombstoneMagic "KVTB" and value_len 0, written when a key is removed, in
// the directory of the record it removes (so that record's region is always
// reclaimed first). Recovery drops every record of the key at an earlier
// position (region seq, then offset) and keeps later ones. Additive: a
// reader that does not know the magic skips it like padding (the removed
// key then comes back after a crash, as before tombstones existed).
//
// Checkpoint file (<dir>/kvpool-ssd.ckpt; trusted only while the superblock
// names its size and CRC): CheckpointHeader, then region_count
// CheckpointRegion, then `entries` CheckpointEntry.
// CheckpointHeader
//     0    4 magic          kCheckpointMagic "KVCK"
//     4    2 version        kSsdFormatVersion
//     6    2 reserved       0
//     8    8 region_bytes   geometry, must equal the superblock's
//    16    8 region_count
//    24    8 uuid_hi        the superblock's uuid
//    32    8 uuid_lo
//    40    8 entries        CheckpointEntry records that follow
//    48    8 next_seq       next region sequence to assign
//    56    4 reserved       0
//    60    4 crc            CRC-32C of bytes 0..59
// CheckpointRegion (16 B): seq (0: free), used bytes
// CheckpointEntry (24 B): key_hi, region (in this file), offset in region,
//                         value length, read count
//
// A region's records end at the first 64 B slot that is not a valid header
// for this region (zero padding, stale data of an older region, a torn
// write); recovery then searches forward for further valid headers so one
// damaged header loses one record, not the rest of the region.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/key_id.h"
#include "store/ssd/crc32c.h"

namespace kvpool::ssd {

inline constexpr uint16_t kSsdFormatVersion = 1;
inline constexpr uint32_t kSuperblockMagic = 0x4253564B;  // "KVSB"
inline constexpr uint32_t kRegionMagic = 0x4752564B;      // "KVRG"
inline constexpr uint32_t kRecordMagic = 0x4352564B;      // "KVRC"
inline constexpr uint32_t kTombstoneMagic = 0x4254564B;   // "KVTB"
inline constexpr uint32_t kCheckpointMagic = 0x4B43564B;  // "KVCK"
inline constexpr uint64_t kSuperblockBytes = 4096;
inline constexpr uint64_t kRegionHeaderBytes = 64;
inline constexpr uint64_t kRecordHeaderBytes = 64;
inline constexpr uint64_t kRecordAlign = 64;

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline constexpr uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }
// Bytes a record of `value_len` takes in a region.
inline constexpr uint64_t RecordBytes(uint64_t value_len) {
  return AlignUp(kRecordHeaderBytes + value_len, kRecordAlign);
}

struct Superblock {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved0;
  uint64_t region_bytes;
  uint64_t region_count;
  uint64_t file_bytes;
  uint64_t uuid_hi;
  uint64_t uuid_lo;
  uint64_t ckpt_bytes;
  uint32_t ckpt_crc;
  uint32_t crc;
};
static_assert(sizeof(Superblock) == 64);

struct RegionHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved0;
  uint64_t seq;
  uint64_t file_offset;
  uint64_t uuid_hi;
  uint64_t uuid_lo;
  uint8_t reserved1[20];
  uint32_t crc;
};
static_assert(sizeof(RegionHeader) == kRegionHeaderBytes);

struct RecordHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;
  uint64_t key_hi;
  uint64_t key_lo;
  uint64_t value_len;
  uint64_t file_offset;
  uint64_t region_seq;
  uint32_t incarnation;
  uint32_t reserved;
  uint32_t data_crc;
  uint32_t header_crc;
};
static_assert(sizeof(RecordHeader) == kRecordHeaderBytes);

struct CheckpointHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved0;
  uint64_t region_bytes;
  uint64_t region_count;
  uint64_t uuid_hi;
  uint64_t uuid_lo;
  uint64_t entries;
  uint64_t next_seq;
  uint32_t reserved1;
  uint32_t crc;
};
static_assert(sizeof(CheckpointHeader) == 64);

struct CheckpointRegion {
  uint64_t seq;
  uint64_t used;
};
static_assert(sizeof(CheckpointRegion) == 16);

struct CheckpointEntry {
  uint64_t key_hi;
  uint32_t region;
  uint32_t offset;
  uint32_t length;
  uint32_t reads;
};
static_assert(sizeof(CheckpointEntry) == 24);

// CRC of everything before the trailing crc field of a 64-byte struct.
template <typename T>
uint32_t TrailerCrc(const T& t) {
  return crc32c::Value(&t, sizeof(T) - 4);
}

// What a record must say about itself to be accepted where it was found.
struct RecordExpect {
  uint64_t file_offset;
  uint64_t region_seq;
  uint32_t incarnation;
};

// Fills `h` (header_crc and data_crc included) for `payload`. With
// copy_to, also copies the payload there in the same pass over it.
inline void EncodeRecordHeader(const KeyId& key, const uint8_t* payload, uint64_t len,
                               const RecordExpect& at, RecordHeader* h,
                               uint32_t magic = kRecordMagic, uint8_t* copy_to = nullptr) {
  std::memset(h, 0, sizeof(*h));
  h->magic = magic;
  h->version = kSsdFormatVersion;
  h->key_hi = key.hi;
  h->key_lo = key.lo;
  h->value_len = len;
  h->file_offset = at.file_offset;
  h->region_seq = at.region_seq;
  h->incarnation = at.incarnation;
  uint32_t c = crc32c::Value(h, 56);
  h->data_crc = copy_to != nullptr ? crc32c::CopyAndExtend(c, copy_to, payload, len)
                                   : crc32c::Extend(c, payload, len);
  h->header_crc = crc32c::Value(h, 60);
}

// True when the header is intact and belongs exactly here (not misplaced,
// not left over from an older region or file incarnation).
inline bool HeaderValidAt(const RecordHeader& h, const RecordExpect& at,
                          uint32_t magic = kRecordMagic) {
  return h.magic == magic && h.version == kSsdFormatVersion &&
         h.header_crc == crc32c::Value(&h, 60) && h.file_offset == at.file_offset &&
         h.region_seq == at.region_seq && h.incarnation == at.incarnation;
}

// True when `h`, found `pos` bytes into a region of `region_bytes`, is a
// record a region scan accepts there: an intact header placed exactly here,
// with its payload inside the region. (The payload CRC is checked on read.)
inline bool RecordValidAt(const RecordHeader& h, uint64_t pos, uint64_t region_bytes,
                          const RecordExpect& at) {
  return HeaderValidAt(h, at) && h.value_len <= UINT32_MAX &&
         pos + RecordBytes(h.value_len) <= region_bytes;
}

inline void EncodeTombstone(const KeyId& key, const RecordExpect& at, RecordHeader* h) {
  EncodeRecordHeader(key, nullptr, 0, at, h, kTombstoneMagic);
}
inline bool TombstoneValidAt(const RecordHeader& h, const RecordExpect& at) {
  return HeaderValidAt(h, at, kTombstoneMagic) && h.value_len == 0 &&
         h.data_crc == crc32c::Value(&h, 56);
}

// True when the payload matches the header's data_crc.
inline bool PayloadValid(const RecordHeader& h, const uint8_t* payload) {
  uint32_t c = crc32c::Value(&h, 56);
  return crc32c::Extend(c, payload, h.value_len) == h.data_crc;
}

}  // namespace kvpool::ssd
