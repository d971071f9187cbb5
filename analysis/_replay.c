/* The optional C kernels of analysis, reached through ctypes (the Python paths give the same numbers).
 *
 * fifo_replay(a, s, n, k, lat, heap): FIFO k-server queue replay for analysis.capacity (batch_replay: with a
 * service time that depends on the batch joined; reactive_replay: with replicas added on demand). Requests in
 * arrival order (a ascending), service times s, k identical servers; lat[j] = finish - arrival.
 * heap: caller's scratch of min(k, n) int64. Each request begins at max(its arrival, the earliest
 * server free time): a binary min-heap of the servers' free times, O(n log k). Returns 0, or -1 on
 * bad arguments.
 *
 * batch_exceeds(...): batch_replay that stops once a given number of latencies are above a limit.
 *
 * count_cells(...): a count of rows by a key made through a table of each code (the report's attribute pairs).
 *
 * critical_path(...): the critical-path sweep of the request model (analysis.engine.model: the relations
 * l1w, l2, l2w, info, parts and stage_ns of chain_ctes) over one hour's request spans and stage
 * spans, for analysis.engine.materialize.build_hour. The SQL of analysis.engine.model is the definition; this is
 * the same computation written as loops, and tests/analysis/test_materialize.py compares the two
 * row for row on thousands of random traces.
 *
 * Built by setup.py as the extension module analysis._replay: the module itself is empty (so
 * that importing it, as tools that walk the package do, works) and the functions are reached
 * through ctypes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Put h[i]'s value where it belongs below i in the binary min-heap h[0..m) ("bottom-up": the hole goes down the
 * smaller children to a leaf, the child chosen without a branch, then the value rises from there; the values
 * replaced at the top are ends and free times, which mostly belong near the leaves). */
static void sift_down(int64_t *h, int64_t m, int64_t i) {
    int64_t v = h[i], top = i;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c + 1 < m)
            c += h[c + 1] < h[c];
        else if (c >= m)
            break;
        h[i] = h[c];
        i = c;
    }
    while (i > top) {
        int64_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

int fifo_replay(const int64_t *a, const int64_t *s, int64_t n, int64_t k, int64_t *lat, int64_t *heap) {
    if (k < 1 || n < 0) return -1;
    if (n == 0) return 0;
    int64_t m = k < n ? k : n;
    for (int64_t i = 0; i < m; i++) heap[i] = a[0];
    for (int64_t j = 0; j < n; j++) {
        int64_t t = heap[0];
        int64_t begin = a[j] > t ? a[j] : t;
        int64_t fin = begin + s[j];
        heap[0] = fin;
        sift_down(heap, m, 0);
        lat[j] = fin - a[j];
    }
    return 0;
}

/* batch_replay(a, base, n, k, replicas, table, tsize, lat, svc, heap, ends): fifo_replay with a service time
 * that depends on the batch a request joins (analysis.capacity.replay_batched). Request j begins at
 * max(a[j], the earliest server free time); m = the requests still in service then (ends > begin); under an
 * even spread over `replicas` it joins a replica serving m / replicas others, so its batch is
 * b = m / replicas + 1 (at most tsize - 1) and its service svc[j] = (int64) (base[j] * table[b]).
 * One min-heap of the ends of the requests in service serves both: begins never decrease, and the servers
 * busy after x >= the last begin are exactly those whose last end (in the heap) is > x, so with
 * x = max(a[j], last begin) and the ends <= x popped, a request begins at x when fewer than min(k, n)
 * remain, else at the earliest end (then popped too); what remains is m. The same numbers as a heap of
 * the servers' free times beside the heap of ends (replay_batched_py, tested), with half the heap work.
 * ends: scratch of min(k, n) int64; heap: unused (kept for the caller's signature). */
static void sift_up(int64_t *h, int64_t i) {
    int64_t v = h[i];
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static int64_t batch_run(const int64_t *a, const double *base, int64_t n, int64_t k, int64_t replicas,
                         const double *table, int64_t tsize, int64_t *lat, int64_t *svc, int64_t *ends, int64_t limit,
                         int64_t allowed) {
    int64_t m = k < n ? k : n;
    int64_t e = 0;  /* entries in ends */
    int64_t last = a[0];  /* the last begin (every server is free at a[0]) */
    int64_t over = 0;  /* latencies above limit so far */
    double *fac = malloc((size_t)m * sizeof(double));  /* fac[e]: the factor of a request joining e in service */
    if (!fac) return -1;
    for (int64_t x = 0; x < m; x++) {
        int64_t b = x / replicas + 1;
        fac[x] = table[b < tsize - 1 ? b : tsize - 1];
    }
    for (int64_t j = 0; j < n; j++) {
        int64_t begin = a[j] > last ? a[j] : last;
        while (e > 0 && ends[0] <= begin) {
            ends[0] = ends[--e];
            sift_down(ends, e, 0);
        }
        if (e == m) {  /* every server busy after begin: the earliest end frees one */
            begin = ends[0];
            while (e > 0 && ends[0] <= begin) {
                ends[0] = ends[--e];
                sift_down(ends, e, 0);
            }
        }
        int64_t s = (int64_t)(base[j] * fac[e]);  /* e < m here */
        int64_t fin = begin + s;
        ends[e] = fin;
        sift_up(ends, e);
        e++;
        last = begin;
        lat[j] = fin - a[j];
        svc[j] = s;
        if (lat[j] > limit && ++over >= allowed) {
            free(fac);
            return j + 1;
        }
    }
    free(fac);
    return n;
}

int batch_replay(const int64_t *a, const double *base, int64_t n, int64_t k, int64_t replicas, const double *table,
                 int64_t tsize, int64_t *lat, int64_t *svc, int64_t *heap, int64_t *ends) {
    (void)heap;
    if (k < 1 || n < 0 || replicas < 1 || tsize < 2) return -1;
    if (n == 0) return 0;
    if (batch_run(a, base, n, k, replicas, table, tsize, lat, svc, ends, INT64_MAX, n + 1) < 0) return -1;
    return 0;
}

/* batch_exceeds(a, base, n, k, replicas, table, tsize, limit, allowed, lat, svc, ends): batch_replay that stops
 * as soon as `allowed` latencies are above `limit` (then a quantile at or above that rank is too: the capacity
 * curve's search for the fewest count, analysis.capacity.batched_p99). Returns 1 when it stopped so, 0 when every
 * request was replayed (lat, svc as batch_replay's), -1 on bad arguments. */
int batch_exceeds(const int64_t *a, const double *base, int64_t n, int64_t k, int64_t replicas, const double *table,
                  int64_t tsize, int64_t limit, int64_t allowed, int64_t *lat, int64_t *svc, int64_t *ends) {
    if (k < 1 || n < 0 || replicas < 1 || tsize < 2 || allowed < 1) return -1;
    if (n == 0) return 0;
    int64_t done = batch_run(a, base, n, k, replicas, table, tsize, lat, svc, ends, limit, allowed);
    return done < 0 ? -1 : done < n ? 1 : 0;
}

/* ---- point_stats ---------------------------------------------------------------------------- */

/* Order statistics without sorting: the values of ranks k and k2 = k or k + 1 (k2 < n) of n int64, ascending. A
 * round counts the candidates into 2^SEL_BITS buckets of (x - min) >> shift, the shift the fewest that puts max in
 * the last buckets (so min and max never share one). When ranks k and k2 fall in different buckets, k is the
 * largest of its bucket and k2 the smallest of its own (the buckets between are empty): one more pass. Else the
 * candidates of k's bucket are kept and the next round splits their range 2^(SEL_BITS - 1) times finer (a bucket
 * that holds every candidate holds min and max: they are all equal); at most SEL_SORTED candidates are sorted. A few passes over the values instead of a partition of a copy. */
#define SEL_BITS 14
#define SEL_BUCKETS (1 << SEL_BITS)
#define SEL_SORTED 48

typedef struct { int64_t mn; int shift; } Buckets;

static Buckets buckets_of(const int64_t *v, int64_t m, int64_t *hist, const int64_t *range) {
    int64_t mn = v[0], mx = v[0];
    if (range != NULL) {
        mn = range[0];
        mx = range[1];
    } else {
        for (int64_t i = 1; i < m; i++) {
            mn = v[i] < mn ? v[i] : mn;
            mx = v[i] > mx ? v[i] : mx;
        }
    }
    uint64_t span = (uint64_t)mx - (uint64_t)mn;
    int bits = 0;
    while (bits < 64 && (span >> bits) != 0) bits++;
    Buckets bk = {mn, bits > SEL_BITS ? bits - SEL_BITS : 0};
    memset(hist, 0, SEL_BUCKETS * sizeof(int64_t));
    for (int64_t i = 0; i < m; i++) hist[((uint64_t)v[i] - (uint64_t)mn) >> bk.shift]++;
    return bk;
}

#define BUCKET(bk, x) ((int64_t)(((uint64_t)(x) - (uint64_t)(bk).mn) >> (bk).shift))

/* Ranks k <= k2 among the counted values: in buckets b[0] <= b[1]; below: the values in buckets before b[0]. */
static void rank_buckets(const int64_t *hist, int64_t k, int64_t k2, int64_t *b, int64_t *below) {
    int64_t b1 = 0, n1 = 0;
    while (n1 + hist[b1] <= k) n1 += hist[b1++];
    int64_t b2 = b1, upto = n1 + hist[b1];
    while (upto <= k2) upto += hist[++b2];
    b[0] = b1;
    b[1] = b2;
    *below = n1;
}

/* The values of ranks k, k2 among s[0..m) (s is reordered: the kept candidates move to its front). */
static void select_inplace(int64_t *s, int64_t m, int64_t k, int64_t k2, int64_t *lo, int64_t *hi, int64_t *hist) {
    for (;;) {
        if (m <= SEL_SORTED) {
            for (int64_t t = 1; t < m; t++) {
                int64_t x = s[t], u = t;
                while (u > 0 && s[u - 1] > x) { s[u] = s[u - 1]; u--; }
                s[u] = x;
            }
            *lo = s[k];
            *hi = s[k2];
            return;
        }
        Buckets bk = buckets_of(s, m, hist, NULL);
        int64_t b[2], below, j = 0;
        rank_buckets(hist, k, k2, b, &below);
        if (b[0] < b[1]) {
            int64_t top = INT64_MIN, bottom = INT64_MAX;
            for (int64_t i = 0; i < m; i++) {
                int64_t c = BUCKET(bk, s[i]);
                if (c == b[0] && s[i] > top) top = s[i];
                if (c == b[1] && s[i] < bottom) bottom = s[i];
            }
            *lo = top;
            *hi = bottom;
            return;
        }
        if (hist[b[0]] == m) {  /* one bucket holds min and max: all equal */
            *lo = *hi = s[0];
            return;
        }
        for (int64_t i = 0; i < m; i++)
            if (BUCKET(bk, s[i]) == b[0]) s[j++] = s[i];
        m = j;
        k -= below;
        k2 -= below;
    }
}

/* The values of each pair of ranks (ranks[2i] <= ranks[2i + 1] <= ranks[2i] + 1 < n) of v[0..n) into out[2i],
 * out[2i + 1]. The pairs share the first round's count and one pass after it, which copies out only the buckets
 * still to split. range: v's min and max when known (else NULL). Returns 0, or -1 on a bad pair or when out of
 * memory. */
static int select_pairs(const int64_t *v, int64_t n, const int64_t *ranks, int64_t npairs, int64_t *out,
                        const int64_t *range) {
    for (int64_t p = 0; p < npairs; p++) {
        int64_t k = ranks[2 * p], k2 = ranks[2 * p + 1];
        if (k < 0 || k2 < k || k2 > k + 1 || k2 >= n) return -1;
    }
    if (npairs == 0) return 0;
    int rc = -1;
    int64_t *hist = malloc(SEL_BUCKETS * sizeof(int64_t)), *b = malloc((size_t)npairs * 4 * sizeof(int64_t));
    int64_t **kept = calloc((size_t)npairs, sizeof(int64_t *));
    if (!hist || !b || !kept) goto done;
    Buckets bk = buckets_of(v, n, hist, range);
    /* b[4p ..]: pair p's two buckets, the count below them, the candidates kept so far */
    for (int64_t p = 0; p < npairs; p++) {
        int64_t *q = b + 4 * p;
        rank_buckets(hist, ranks[2 * p], ranks[2 * p + 1], q, &q[2]);
        q[3] = 0;
        out[2 * p] = INT64_MIN;
        out[2 * p + 1] = INT64_MAX;
        if (q[0] == q[1] && !(kept[p] = malloc((size_t)hist[q[0]] * sizeof(int64_t)))) goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t x = v[i], c = BUCKET(bk, x);
        for (int64_t p = 0; p < npairs; p++) {
            int64_t *q = b + 4 * p;
            if (q[0] == q[1]) {
                if (c == q[0]) kept[p][q[3]++] = x;
            } else {  /* ranks k and k2 in different buckets: the largest of k's, the smallest of k2's */
                if (c == q[0] && x > out[2 * p]) out[2 * p] = x;
                if (c == q[1] && x < out[2 * p + 1]) out[2 * p + 1] = x;
            }
        }
    }
    for (int64_t p = 0; p < npairs; p++) {
        int64_t *q = b + 4 * p;
        if (q[0] == q[1])  /* the count's array is free again: the later rounds use it */
            select_inplace(kept[p], q[3], ranks[2 * p] - q[2], ranks[2 * p + 1] - q[2], &out[2 * p], &out[2 * p + 1],
                           hist);
    }
    rc = 0;
done:
    for (int64_t p = 0; kept && p < npairs; p++) free(kept[p]);
    free(kept);
    free(b);
    free(hist);
    return rc;
}

/* A double's bits as an int64 in the doubles' order (negatives' magnitude bits flipped), and back. */
static int64_t f64_key(double x) {
    int64_t i;
    memcpy(&i, &x, sizeof i);
    return i < 0 ? i ^ INT64_MAX : i;
}

static double key_f64(int64_t i) {
    double x;
    if (i < 0) i ^= INT64_MAX;
    memcpy(&x, &i, sizeof x);
    return x;
}

/* point_stats(lat, svc, rest, n, ranks, nranks, tranks, ntranks, out, tout, tvals): a capacity point's
 * quantiles' order statistics (analysis.capacity.kernel_quantiles; numpy's quantile interpolates between the same
 * two values). ranks: nranks pairs of lat's ranks (k, k or k + 1) -> out. With rest (not NULL): the TTFTs, the
 * doubles (lat[j] - svc[j]) + rest[j] of the requests whose rest is not NaN (kept in tvals as `f64_key`s, n
 * int64), and ntranks pairs of their ranks -> tout. Returns the number of TTFTs (0 without rest),
 * or -1 on a rank outside its values or when out of memory. */
int64_t point_stats(const int64_t *lat, const int64_t *svc, const double *rest, int64_t n, const int64_t *ranks,
                    int64_t nranks, const int64_t *tranks, int64_t ntranks, int64_t *out, double *tout,
                    int64_t *tvals) {
    if (n < 0 || nranks < 0 || ntranks < 0 || select_pairs(lat, n, ranks, nranks, out, NULL) < 0) return -1;
    if (rest == NULL) return 0;
    int64_t nt = 0, range[2] = {INT64_MAX, INT64_MIN};
    for (int64_t j = 0; j < n; j++) {
        if (rest[j] != rest[j]) continue;
        int64_t key = f64_key((double)(lat[j] - svc[j]) + rest[j]);
        range[0] = key < range[0] ? key : range[0];
        range[1] = key > range[1] ? key : range[1];
        tvals[nt++] = key;
    }
    int64_t *keys = malloc((size_t)(2 * ntranks + 1) * sizeof(int64_t));
    if (!keys) return -1;
    int rc = select_pairs(tvals, nt, tranks, ntranks, keys, range);
    for (int64_t i = 0; rc == 0 && i < 2 * ntranks; i++) tout[i] = key_f64(keys[i]);
    free(keys);
    return rc < 0 ? -1 : nt;
}

/* reactive_replay(a, s, base, n, slots, replicas, max_replicas, cold, table, tsize, lat, svc, added, nadded, heap,
 * ends): reactive scale-up (analysis.capacity.reactive_batched, whose Python loop gives the same numbers). At an
 * arrival that finds every server busy (the earliest free time after it), no replica starting (a >= ready_at)
 * and fewer than max_replicas, one replica starts: `slots` servers free at a + cold; added[] gets a. Request j
 * begins at max(a[j], the earliest free time). Without a table (NULL) it runs s[j]; with one, m = the requests
 * in service then (a min-heap of their ends), ready = the replicas serving (one fewer while the last started is
 * in its cold start), b = m / ready + 1 (at most tsize - 1) and it runs (int64) (base[j] * table[b]).
 * heap, ends: scratch of max_replicas * slots int64; added: of max_replicas. */
int reactive_replay(const int64_t *a, const int64_t *s, const double *base, int64_t n, int64_t slots,
                    int64_t replicas, int64_t max_replicas, int64_t cold, const double *table, int64_t tsize,
                    int64_t *lat, int64_t *svc, int64_t *added, int64_t *nadded, int64_t *heap, int64_t *ends) {
    if (slots < 1 || replicas < 1 || max_replicas < replicas || cold < 0 || n < 0) return -1;
    if (table != NULL && tsize < 2) return -1;
    *nadded = 0;
    if (n == 0) return 0;
    int64_t m = replicas * slots, cap = max_replicas * slots, e = 0, count = replicas, ready_at = -1;
    for (int64_t i = 0; i < m; i++) heap[i] = a[0];
    for (int64_t j = 0; j < n; j++) {
        if (heap[0] > a[j] && a[j] >= ready_at && count < max_replicas) {
            added[(*nadded)++] = a[j];
            count++;
            ready_at = a[j] + cold;
            for (int64_t k = 0; k < slots; k++) {
                heap[m] = ready_at;
                sift_up(heap, m);
                m++;
            }
        }
        int64_t t = heap[0];
        int64_t begin = a[j] > t ? a[j] : t;
        int64_t sj;
        if (table == NULL) {
            sj = s[j];
        } else {
            while (e > 0 && ends[0] <= begin) {
                ends[0] = ends[--e];
                sift_down(ends, e, 0);
            }
            int64_t ready = begin < ready_at ? count - 1 : count;
            int64_t b = e / ready + 1;
            if (b > tsize - 1) b = tsize - 1;
            sj = (int64_t)(base[j] * table[b]);
            if (e < cap) {  /* at most one in service per server: see batch_replay */
                ends[e] = begin + sj;
                sift_up(ends, e);
                e++;
            }
        }
        heap[0] = begin + sj;
        sift_down(heap, m, 0);
        lat[j] = begin + sj - a[j];
        svc[j] = sj;
    }
    return 0;
}

/* ---- count_cells --------------------------------------------------------------------------- */

/* count_cells(codes, width, n, table, tsize, plus, weights, counts, sums, cells): one count of rows by a key
 * (analysis.stats.attributes.LazyCoded.count_keyed; numpy's bincount of the same keys gives the same numbers).
 * Row r (r < n) falls in cell table[codes[r]] + plus[r]: counts[cell] += 1 and, with weights (not NULL),
 * sums[cell] += weights[r], in row order. codes: n signed integers of `width` bytes (1, 2, 4 or 8), each an index
 * into table (tsize entries). Returns 0, or -1 (counts left partly made) on a bad width, a code outside the
 * table or a cell outside [0, cells). */
#define COUNT_CELLS_LOOP(T)                                                                                 \
    for (int64_t r = 0; r < n; r++) {                                                                       \
        int64_t c = (int64_t)((const T *)codes)[r];                                                         \
        if (c < 0 || c >= tsize) return -1;                                                                 \
        int64_t cell = table[c] + plus[r];                                                                  \
        if (cell < 0 || cell >= cells) return -1;                                                           \
        counts[cell]++;                                                                                     \
        if (weights != NULL) sums[cell] += weights[r];                                                      \
    }

int count_cells(const void *codes, int64_t width, int64_t n, const int64_t *table, int64_t tsize,
                const int64_t *plus, const double *weights, int64_t *counts, double *sums, int64_t cells) {
    if (n < 0 || (weights != NULL && sums == NULL)) return -1;
    switch (width) {
    case 1: COUNT_CELLS_LOOP(int8_t) break;
    case 2: COUNT_CELLS_LOOP(int16_t) break;
    case 4: COUNT_CELLS_LOOP(int32_t) break;
    case 8: COUNT_CELLS_LOOP(int64_t) break;
    default: return -1;
    }
    return 0;
}

/* ---- critical_path ------------------------------------------------------------------------ */

#define HOUR_NS 3600000000000LL

typedef struct {  /* a level-1 or level-2 row (a stage span read by a request, clipped) */
    int64_t j;      /* request index */
    int64_t i;      /* stage span index */
    int64_t pk;     /* level 2: the parent's span hash (partition key); level 1: 0 */
    int64_t ps;     /* level 2: the parent's stretch start (partition key); level 1: 0 */
    int64_t s0, e0, x1;
    int32_t yielding;
    int32_t pstage; /* level 2: the parent's stage code */
} Row;

typedef struct {
    const int64_t *id_off;      /* span ids: Arrow large_string offsets and bytes; id_ok: not NULL */
    const char *id_dat;
    const uint8_t *id_ok;
} Ids;

/* SpanId ascending, NULLs last, byte-wise like DuckDB's VARCHAR order. */
static int cmp_id(const Ids *ids, int64_t a, int64_t b) {
    int na = !ids->id_ok[a], nb = !ids->id_ok[b];
    if (na || nb) return na - nb;
    int64_t la = ids->id_off[a + 1] - ids->id_off[a], lb = ids->id_off[b + 1] - ids->id_off[b];
    int c = memcmp(ids->id_dat + ids->id_off[a], ids->id_dat + ids->id_off[b], (size_t)(la < lb ? la : lb));
    if (c) return c < 0 ? -1 : 1;
    return (la > lb) - (la < lb);
}

#define CMP(x, y) do { if ((x) != (y)) return (x) < (y) ? -1 : 1; } while (0)

/* The sweep's order: partition (j, pk, ps, yielding), then e0 DESC, s0 DESC, SpanId. */
static int cmp_row(const Row *a, const Row *b, const Ids *ids) {
    CMP(a->j, b->j);
    CMP(a->pk, b->pk);
    CMP(a->ps, b->ps);
    CMP(a->yielding, b->yielding);
    CMP(b->e0, a->e0);
    CMP(b->s0, a->s0);
    return cmp_id(ids, a->i, b->i);
}

static int same_part(const Row *a, const Row *b) {
    return a->j == b->j && a->pk == b->pk && a->ps == b->ps && a->yielding == b->yielding;
}

/* Stable bottom-up merge sort of n rows (no global state: callers may run in parallel). */
static int merge_sort(Row *r, int64_t n, const Ids *ids) {
    Row *tmp = malloc((size_t)n * sizeof(Row));
    if (!tmp) return -1;
    Row *src = r, *dst = tmp;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi) dst[o++] = cmp_row(&src[b], &src[a], ids) < 0 ? src[b++] : src[a++];
            while (a < mid) dst[o++] = src[a++];
            while (b < hi) dst[o++] = src[b++];
        }
        Row *t = src; src = dst; dst = t;
    }
    if (src != r) memcpy(r, src, (size_t)n * sizeof(Row));
    free(tmp);
    return 0;
}

/* Sort rows in the sweep's order: a counting sort by request (j < nr), then each request's few rows. */
static int sort_rows(Row **rows, int64_t n, int64_t nr, const Ids *ids) {
    if (n < 2) return 0;
    Row *r = *rows, *out = malloc((size_t)n * sizeof(Row));
    int64_t *start = calloc((size_t)nr + 1, sizeof(int64_t));
    if (!out || !start) { free(out); free(start); return -1; }
    for (int64_t t = 0; t < n; t++) start[r[t].j + 1]++;
    for (int64_t j = 0; j < nr; j++) start[j + 1] += start[j];
    for (int64_t t = 0; t < n; t++) out[start[r[t].j]++] = r[t];
    free(r);
    *rows = out;
    int rc = 0;
    for (int64_t lo = 0, hi; lo < n && rc == 0; lo = hi) {
        for (hi = lo + 1; hi < n && out[hi].j == out[lo].j; hi++) {}
        if (hi - lo > 32) {
            rc = merge_sort(out + lo, hi - lo, ids);
            continue;
        }
        for (int64_t t = lo + 1; t < hi; t++) {  /* insertion sort: stable */
            Row v = out[t];
            int64_t u = t;
            while (u > lo && cmp_row(&v, &out[u - 1], ids) < 0) { out[u] = out[u - 1]; u--; }
            out[u] = v;
        }
    }
    free(start);
    return rc;
}

/* x1 of every row: greatest(s0, least(e0, min(s0) of the earlier rows of its partition, else e0)). */
static void sweep(Row *r, int64_t n) {
    int64_t m = 0;
    for (int64_t t = 0; t < n; t++) {
        int first = t == 0 || !same_part(&r[t - 1], &r[t]);
        int64_t lim = first ? r[t].e0 : (m < r[t].e0 ? m : r[t].e0);
        r[t].x1 = lim > r[t].s0 ? lim : r[t].s0;
        m = first || r[t].s0 < m ? r[t].s0 : m;
    }
}

/* An open-addressing table of 64-bit keys -> first index of a chain (next[] links equal keys). A slot
 * holds its key and head side by side: one cache line per probe. */
typedef struct { int64_t key, head; } Slot;
typedef struct { int64_t cap; Slot *slot; } Table;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    return x;
}

static int table_init(Table *t, int64_t n) {
    t->cap = 16;
    while (t->cap < n + n / 2) t->cap *= 2;
    t->slot = malloc((size_t)t->cap * sizeof(Slot));
    if (!t->slot) return -1;
    for (int64_t q = 0; q < t->cap; q++) t->slot[q].head = -1;
    return 0;
}

/* The head of `key`'s chain, to be set (insert). */
static int64_t *table_slot(Table *t, int64_t key) {
    uint64_t m = (uint64_t)(t->cap - 1), q = mix((uint64_t)key) & m;
    while (t->slot[q].head >= 0 && t->slot[q].key != key) q = (q + 1) & m;
    t->slot[q].key = key;
    return &t->slot[q].head;
}

/* The head of `key`'s chain, or -1 (look-up: writes nothing). */
static int64_t table_get(const Table *t, int64_t key) {
    uint64_t m = (uint64_t)(t->cap - 1), q = mix((uint64_t)key) & m;
    while (t->slot[q].head >= 0) {
        if (t->slot[q].key == key) return t->slot[q].head;
        q = (q + 1) & m;
    }
    return -1;
}

static void table_free(Table *t) { free(t->slot); }

static int push(Row **rows, int64_t *n, int64_t *cap, Row row) {
    if (*n == *cap) {
        int64_t c = *cap ? 2 * *cap : 1024;
        Row *g = realloc(*rows, (size_t)c * sizeof(Row));
        if (!g) return -1;
        *rows = g;
        *cap = c;
    }
    (*rows)[(*n)++] = row;
    return 0;
}

static int64_t lo_of(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t hi_of(int64_t a, int64_t b) { return a > b ? a : b; }

/* The first token and replica a row gives its request (the relation `info`). */
static void info_of(const Row *w, const int64_t *s, const int64_t *e, const int32_t *stage, const uint8_t *flags,
                    const uint8_t *rep_ok, const Ids *ids, int64_t *prefill_end, uint8_t *prefill_ok,
                    int64_t *stream_start, uint8_t *stream_ok, int64_t *worker) {
    int64_t j = w->j, i = w->i;
    uint8_t f = flags[stage[i]];
    if ((f & 1) && (!prefill_ok[j] || e[i] < prefill_end[j])) { prefill_end[j] = e[i]; prefill_ok[j] = 1; }
    if ((f & 2) && (!stream_ok[j] || s[i] < stream_start[j])) { stream_start[j] = s[i]; stream_ok[j] = 1; }
    if ((f & 4) && rep_ok[i]) {
        int64_t b = worker[j];
        if (b < 0 || s[i] < s[b] || (s[i] == s[b] && cmp_id(ids, i, b) < 0)) worker[j] = i;
    }
}

/* Add a request's parts to its stage sums: each stretch for its stage (level 2: taken from the
 * parent's stage), each yielding stretch less its overlap with each working sibling's stretch. */
static void parts_of(const Row *r, int64_t lo, int64_t hi, int level, const int32_t *stage, int64_t nstages,
                     int64_t *stage_ns, int64_t *covered) {
    for (int64_t t = lo; t < hi; t++) {
        const Row *y = &r[t];
        if (y->x1 <= y->s0) continue;
        int64_t len = y->x1 - y->s0, *out = stage_ns + y->j * (nstages + 1);
        out[stage[y->i]] += len;
        covered[y->j] += len;
        if (level == 2) { out[y->pstage] -= len; covered[y->j] -= len; }
        if (!y->yielding) continue;
        for (int64_t u = lo; u < hi; u++) {
            const Row *w = &r[u];
            if (w->yielding || w->x1 <= w->s0) continue;
            int64_t ov = lo_of(y->x1, w->x1) - hi_of(y->s0, w->s0);
            if (ov <= 0) continue;
            out[stage[y->i]] -= ov;
            covered[y->j] -= ov;
            if (level == 2) { out[y->pstage] += ov; covered[y->j] += ov; }
        }
    }
}

/* Requests (nr): span hash rk, start rs, end re, hour hr, req_ok (rs and re not NULL); rk unique.
 * Stage spans (ns): span hash k, parent hash pk, start s, end e, stage code (0..nstages, nstages for
 * a stage outside the vocabulary), rep_ok (Replica not NULL), span ids; yielding[code]; flags[code]:
 * 1 prefill, 2 streaming, 4 worker stage. Out, per request: stage_ns[j * (nstages + 1) + code]
 * (critical ns), covered[j], prefill_end / stream_start with their _ok flags, worker (the stage span
 * whose Replica is the request's, or -1). Returns 0, or -1 when out of memory. */
int critical_path(int64_t nr, const int64_t *rk, const int64_t *rs, const int64_t *re, const int64_t *hr,
                  const uint8_t *req_ok, int64_t ns, const int64_t *k, const int64_t *pk, const int64_t *s,
                  const int64_t *e, const int32_t *stage, const uint8_t *rep_ok, const int64_t *id_off,
                  const char *id_dat, const uint8_t *id_ok, int64_t nstages, const uint8_t *yielding,
                  const uint8_t *flags, int64_t *stage_ns, int64_t *covered, int64_t *prefill_end,
                  uint8_t *prefill_ok, int64_t *stream_start, uint8_t *stream_ok, int64_t *worker) {
    Ids ids = {id_off, id_dat, id_ok};
    int rc = -1;
    Row *l1 = NULL, *l2 = NULL;
    int64_t n1 = 0, c1 = 0, n2 = 0, c2 = 0, *next = NULL;
    Table reqs = {0, NULL}, parents = {0, NULL};
    for (int64_t j = 0; j < nr; j++) {
        covered[j] = 0; prefill_ok[j] = 0; stream_ok[j] = 0; worker[j] = -1;
        for (int64_t c = 0; c <= nstages; c++) stage_ns[j * (nstages + 1) + c] = 0;
    }
    if (table_init(&reqs, nr) < 0) goto done;
    for (int64_t j = 0; j < nr; j++) if (req_ok[j]) *table_slot(&reqs, rk[j]) = j;
    /* level 1: stage children of the request span that overlap it, clipped to it */
    for (int64_t i = 0; i < ns; i++) {
        int64_t j = table_get(&reqs, pk[i]);
        if (j < 0) continue;
        if (!(lo_of(e[i], re[j]) > hi_of(s[i], rs[j])) || s[i] < hr[j] - HOUR_NS || s[i] >= hr[j] + 2 * HOUR_NS)
            continue;
        Row w = {j, i, 0, 0, hi_of(s[i], rs[j]), lo_of(e[i], re[j]), 0, yielding[stage[i]], 0};
        if (push(&l1, &n1, &c1, w) < 0) goto done;
    }
    if (sort_rows(&l1, n1, nr, &ids) < 0) goto done;
    sweep(l1, n1);
    /* level 2: stage children of a working level-1 row that overlap the request, clipped to its stretch */
    if (table_init(&parents, n1) < 0) goto done;
    next = malloc((size_t)(n1 ? n1 : 1) * sizeof(int64_t));
    if (!next) goto done;
    for (int64_t t = n1 - 1; t >= 0; t--) {
        if (l1[t].yielding) continue;
        int64_t *h = table_slot(&parents, k[l1[t].i]);
        next[t] = *h;
        *h = t;
    }
    for (int64_t i = 0; i < ns; i++) {
        for (int64_t t = table_get(&parents, pk[i]); t >= 0; t = next[t]) {
            const Row *p = &l1[t];
            int64_t j = p->j;
            if (!(lo_of(e[i], re[j]) > hi_of(s[i], rs[j])) || s[i] < hr[j] - HOUR_NS || s[i] >= hr[j] + 2 * HOUR_NS)
                continue;
            Row c = {j, i, k[p->i], p->s0, hi_of(s[i], p->s0), lo_of(e[i], p->x1), 0, yielding[stage[i]],
                     stage[p->i]};
            info_of(&c, s, e, stage, flags, rep_ok, &ids, prefill_end, prefill_ok, stream_start, stream_ok, worker);
            if (c.e0 > c.s0 && push(&l2, &n2, &c2, c) < 0) goto done;
        }
    }
    for (int64_t t = 0; t < n1; t++)
        info_of(&l1[t], s, e, stage, flags, rep_ok, &ids, prefill_end, prefill_ok, stream_start, stream_ok, worker);
    if (sort_rows(&l2, n2, nr, &ids) < 0) goto done;
    sweep(l2, n2);
    /* parts: level 1 per request (both yielding groups are adjacent), level 2 per (request, parent, ps) */
    for (int64_t lo = 0, hi; lo < n1; lo = hi) {
        for (hi = lo + 1; hi < n1 && l1[hi].j == l1[lo].j; hi++) {}
        parts_of(l1, lo, hi, 1, stage, nstages, stage_ns, covered);
    }
    for (int64_t lo = 0, hi; lo < n2; lo = hi) {
        for (hi = lo + 1; hi < n2 && l2[hi].j == l2[lo].j && l2[hi].pk == l2[lo].pk && l2[hi].ps == l2[lo].ps; hi++) {}
        parts_of(l2, lo, hi, 2, stage, nstages, stage_ns, covered);
    }
    rc = 0;
done:
    free(l1); free(l2); free(next);
    table_free(&reqs); table_free(&parents);
    return rc;
}

static struct PyModuleDef replay_module = {
    PyModuleDef_HEAD_INIT, "_replay", "C kernels of analysis (FIFO replay, critical-path sweep); called through ctypes.",
    -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&replay_module); }
