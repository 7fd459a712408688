/* The trace that decides whether a step may replay a recorded graph
 * (backends/graph-trace.h): a step that would launch exactly what the
 * recording launched, with its host arrays in the same places, matches;
 * a step that differs anywhere (one byte of one item, an item's size or
 * kind, one item more or fewer, an array's size) does not, and says
 * where; a recording with an undescribed command or an overfull arena is
 * never replayed. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/graph-trace.h"
#include "tap.h"

#include <stdint.h>
#include <string.h>

#define ARENA ((size_t)1 << 20)
#define ALIGN 16

/* A synthetic step: item i is a launch of `i % 40 + 1` bytes derived from
 * (seed, i), and every fifth is a host array of i % 37 + 1 bytes. */
typedef struct step_plan {
    uint32_t n_items;
    uint32_t seed;
    int32_t flip_item;  /* this item's bytes differ (-1: none) */
    int32_t resize_item; /* this item is one byte longer (-1: none) */
    int32_t rekind_item; /* this item has another kind (-1: none) */
} step_plan;

static int is_array(uint32_t i)
{
    return i % 5 == 4;
}

/* Walks the plan through t; returns how many items were accepted, and the
 * arena offsets given to arrays in offsets[] (when not NULL). */
static uint32_t walk(pv_graph_trace *t, const step_plan *p, size_t *offsets)
{
    uint32_t accepted = 0;
    for (uint32_t i = 0; i < p->n_items; i++) {
        unsigned char bytes[64];
        size_t n = i % 40 + 1;
        for (size_t b = 0; b < n + 1; b++)
            bytes[b] = (unsigned char)(p->seed * 31 + i * 7 + b);
        if ((int32_t)i == p->flip_item)
            bytes[n / 2] ^= 0x10;
        if ((int32_t)i == p->resize_item)
            n++;
        pv_trace_kind kind = (int32_t)i == p->rekind_item ? PV_TRACE_COPY : PV_TRACE_LAUNCH;
        int kept;
        if (is_array(i)) {
            size_t at = 0;
            kept = pv_graph_trace_place(t, i % 37 + 1 + ((int32_t)i == p->resize_item), ALIGN, ARENA, &at);
            if (kept && offsets)
                offsets[i] = at;
        } else {
            kept = pv_graph_trace_item(t, kind, bytes, n);
        }
        accepted += kept != 0;
    }
    return accepted;
}

static int record(pv_graph_trace *t, const step_plan *p, size_t *offsets)
{
    pv_graph_trace_record_start(t);
    walk(t, p, offsets);
    return pv_graph_trace_end(t);
}

static int check(pv_graph_trace *t, const step_plan *p, size_t *offsets)
{
    if (pv_graph_trace_check_start(t) != PV_OK)
        return -1;
    walk(t, p, offsets);
    return pv_graph_trace_end(t);
}

static step_plan plan(uint32_t n_items)
{
    return (step_plan){.n_items = n_items, .seed = 5, .flip_item = -1, .resize_item = -1, .rekind_item = -1};
}

/* Every single difference, at every position of a 60-item step, is caught
 * and located; the same step matches again after each. */
static void test_every_difference(void)
{
    pv_graph_trace t = {0};
    const step_plan base = plan(60);
    size_t rec_off[60] = {0}, chk_off[60] = {0};
    const int recorded = record(&t, &base, rec_off);
    ok(recorded == 1 && t.items == 60 && t.complete, "a 60-item step is recorded (%u items)", t.items);
    ok(check(&t, &base, chk_off) == 1 && memcmp(rec_off, chk_off, sizeof rec_off) == 0,
       "the same step matches, its arrays at the recording's offsets");
    int flips = 0, resizes = 0, rekinds = 0, located = 0, rematched = 0;
    for (int32_t i = 0; i < 60; i++) {
        step_plan p = base;
        if (!is_array((uint32_t)i)) {
            p.flip_item = i;
            flips += check(&t, &p, NULL) == 0;
            located += t.diverged_item == (uint32_t)i && t.diverged_kind == PV_TRACE_LAUNCH;
            p.flip_item = -1;
            p.rekind_item = i;
            rekinds += check(&t, &p, NULL) == 0;
            located += t.diverged_item == (uint32_t)i && t.diverged_kind == PV_TRACE_COPY;
            p.rekind_item = -1;
        }
        p.resize_item = i;
        resizes += check(&t, &p, NULL) == 0;
        located += t.diverged_item == (uint32_t)i;
        rematched += check(&t, &base, NULL) == 1;
    }
    ok(flips == 48 && rekinds == 48, "one flipped bit in each of 48 launches, and each launch as a copy: %d, %d caught",
       flips, rekinds);
    ok(resizes == 60, "one byte more in each of 60 items (launch or array): %d caught", resizes);
    ok(located == 156, "each located at its item and kind: %d of 156", located);
    ok(rematched == 60, "the recorded step matches again after each difference: %d of 60", rematched);

    step_plan longer = plan(61), shorter = plan(59);
    int matched = check(&t, &longer, NULL);
    ok(matched == 0 && t.diverged_item == 60, "one item more is caught at item 60 (%u)", t.diverged_item);
    matched = check(&t, &shorter, NULL);
    ok(matched == 0 && t.diverged_item == 59 && t.diverged_kind == 0 &&
           strcmp(pv_graph_trace_kind_name(t.diverged_kind), "end of the step") == 0,
       "one item fewer is caught at the end of the step (item %u)", t.diverged_item);
    /* One zero byte more, inside the same 8-byte padding: the bytes
     * compared agree, only the size tells them apart. */
    pv_graph_trace u = {0};
    const unsigned char three[4] = {1, 2, 3, 0};
    pv_graph_trace_record_start(&u);
    pv_graph_trace_item(&u, PV_TRACE_LAUNCH, three, 3);
    pv_graph_trace_end(&u);
    pv_graph_trace_check_start(&u);
    pv_graph_trace_item(&u, PV_TRACE_LAUNCH, three, 4);
    ok(pv_graph_trace_end(&u) == 0, "an item of 3 bytes differs from the same bytes and a zero");
    pv_graph_trace_free(&u);
    step_plan other = base;
    other.seed = 6;
    ok(check(&t, &other, NULL) == 0 && t.diverged_item == 0, "another step differs from its first item");
    pv_graph_trace_free(&t);
}

/* Arrays are placed aligned, one after the other, inside the arena. */
static void test_placement(void)
{
    pv_graph_trace t = {0};
    pv_graph_trace_record_start(&t);
    size_t a = 99, b = 99, c = 99;
    int placed = pv_graph_trace_place(&t, 5, ALIGN, 64, &a) && pv_graph_trace_place(&t, 17, ALIGN, 64, &b) &&
                 pv_graph_trace_place(&t, 16, ALIGN, 64, &c);
    ok(placed && a == 0 && b == 16 && c == 48, "arrays of 5, 17, 16 bytes at 0, 16, 48 (%zu, %zu, %zu)", a, b, c);
    size_t d = 99;
    placed = pv_graph_trace_place(&t, 1, ALIGN, 64, &d);
    ok(!placed && d == 99 && t.arena_need == 65,
       "one more byte does not fit a 64-byte arena; the step would need %zu", t.arena_need);
    ok(pv_graph_trace_end(&t) == 0 && !t.complete, "a recording that outgrew its arena is never checked against");
    ok(pv_graph_trace_check_start(&t) == PV_ERR_STATE, "checking against it is refused");
    pv_graph_trace_free(&t);
}

/* A command the backend could not describe makes the recording unusable;
 * outside a step nothing is kept. */
static void test_opaque_and_off(void)
{
    pv_graph_trace t = {0};
    const uint64_t item = 42;
    ok(pv_graph_trace_item(&t, PV_TRACE_LAUNCH, &item, sizeof item) == 1 && t.len == 0,
       "outside a step an item is accepted and nothing kept");
    pv_graph_trace_record_start(&t);
    pv_graph_trace_item(&t, PV_TRACE_LAUNCH, &item, sizeof item);
    pv_graph_trace_opaque(&t, PV_TRACE_LAUNCH);
    ok(pv_graph_trace_end(&t) == 0 && !t.complete, "a recording with an undescribed launch is not kept");
    step_plan p = plan(10);
    record(&t, &p, NULL);
    pv_graph_trace_check_start(&t);
    walk(&t, &p, NULL);
    pv_graph_trace_opaque(&t, PV_TRACE_LIBRARY);
    ok(pv_graph_trace_end(&t) == 0 && t.diverged_kind == PV_TRACE_LIBRARY,
       "a checked step with an undescribed call does not match");
    ok(check(&t, &p, NULL) == 1, "and the recording still serves the next step");
    pv_graph_trace_free(&t);
    pv_graph_trace_free(NULL);
}

/* A long recording (a step of thousands of launches, the log grown many
 * times) matches itself and catches a difference at its very end. */
static void test_long(void)
{
    pv_graph_trace t = {0};
    step_plan p = plan(20000);
    const int recorded = record(&t, &p, NULL);
    ok(recorded == 1 && t.items == 20000, "a 20,000-item step is recorded (%u items)", t.items);
    ok(check(&t, &p, NULL) == 1, "and matches itself");
    p.flip_item = 19998;
    const int matched = check(&t, &p, NULL);
    ok(matched == 0 && t.diverged_item == 19998, "a flipped bit in item 19998 is caught there (%u)", t.diverged_item);
    pv_graph_trace_free(&t);
}

int main(void)
{
    test_every_difference();
    test_placement();
    test_opaque_and_off();
    test_long();
    return tap_done();
}
