/*
 * Kafka's signed varint (zigzag, as record fields are encoded in magic v2 batches), for the
 * native parts: the readers' column decoder (client/_columns.c) and compaction's record walk
 * (storage/_key_scan.c). Header-only: each includes it.
 */
#ifndef STRATALOG_KAFKA_VARINT_H
#define STRATALOG_KAFKA_VARINT_H

#include <stdint.h>

/* A zigzag varint; on overrun or more than 10 bytes sets *ok = 0. */
static inline int64_t varlong(const uint8_t **pp, const uint8_t *end, int *ok) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 70 && p < end; shift += 7) {
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
        }
    }
    *ok = 0;
    return 0;
}

#endif
