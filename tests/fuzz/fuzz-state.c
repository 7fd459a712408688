/* libFuzzer target: the session state file decoder (engine/engine_state.c)
 * on arbitrary bytes, any identity accepted. A decode either fails with a
 * message, or gives an image whose records lie within its history and
 * layers, in order, and which encodes back to exactly the input bytes. */
#include <pensieve/state.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
