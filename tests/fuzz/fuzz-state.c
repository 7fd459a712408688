/* libFuzzer target: the session state file decoder (engine/engine_state.c)
 * on arbitrary bytes, any identity accepted. A decode either fails with a
 * message, or gives an image whose records lie within its history and
 * layers, in order, and which encodes back to exactly the input bytes.
 *
 * Random mutations almost never keep the checksums right, so on their own
 * they test the checksum refusal and little past it. The custom mutator
 * repairs the checksums of three mutants in four (the header's and every
 * chunk's, from the layout state.h documents), so that bit flips and lying
 * counts and lengths reach the checks behind the checksums, as a crafted
 * file would. */
#include <pensieve/state.h>

#include <zlib.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

#define HEADER_BYTES 96
#define RECORD_BYTES 16

static uint64_t le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t crc_of(uint32_t c, const uint8_t *p, size_t n)
{
    return (uint32_t)crc32(c, p, (uInt)n);
}

/* Rewrites the checksums a file of these counts would carry, as far as
 * its bytes reach; counts that overflow or point past the end are left
 * for the decoder to refuse. */
static void repair_checksums(uint8_t *f, size_t size)
{
    if (size < HEADER_BYTES)
        return;
    uint64_t id_len = le(f + 60, 4), n_history = le(f + 64, 8), n_pending = le(f + 72, 8);
    uint64_t n_records = le(f + 80, 8), slot_bytes = le(f + 40, 8);
    if (id_len > size || n_history > size || n_pending > size || n_records > size)
        return;
    uint64_t table = HEADER_BYTES + id_len + 4 * (n_history + n_pending);
    uint64_t kv = table + RECORD_BYTES * n_records;
    if (kv > size)
        return;
    for (uint64_t i = 0; i < n_records && slot_bytes && slot_bytes <= size; i++) {
        uint64_t at = kv + i * slot_bytes;
        if (at + slot_bytes > size)
            break;
        put_le32(f + table + RECORD_BYTES * i + 8, crc_of(0, f + at, (size_t)slot_bytes));
    }
    put_le32(f + 88, crc_of(crc_of(0, f, 88), f + HEADER_BYTES, (size_t)(kv - HEADER_BYTES)));
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    size = LLVMFuzzerMutate(data, size, max_size);
    if (seed % 4 != 0)
        repair_checksums(data, size);
    return size;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pv_session_image *img = NULL;
    if (pv_session_image_decode(data, size, NULL, "fuzz", &img) != PV_OK) {
        if (!strstr(pv_last_error(), "fuzz")) {
            fprintf(stderr, "fuzz-state: an error that does not name the file: %s\n", pv_last_error());
            abort();
        }
        return 0;
    }
    uint64_t chunks = (img->n_history + img->ident.chunk_tokens - 1) / img->ident.chunk_tokens;
    for (size_t i = 0; i < img->n_records; i++) {
        const pv_state_record *r = &img->records[i];
        if (r->chunk >= chunks || r->layer >= img->ident.n_layers ||
            (i && (r->chunk < r[-1].chunk || (r->chunk == r[-1].chunk && r->layer <= r[-1].layer)))) {
            fprintf(stderr, "fuzz-state: record %zu (chunk %u, layer %u) accepted out of range or order\n", i,
                    r->chunk, r->layer);
            abort();
        }
    }
    uint8_t *again = NULL;
    size_t n = 0;
    if (pv_session_image_encode(img, &again, &n) != PV_OK || n != size || memcmp(again, data, size) != 0) {
        fprintf(stderr, "fuzz-state: a decoded image does not encode back to its bytes\n");
        abort();
    }
    free(again);
    pv_session_image_free(img);
    return 0;
}
