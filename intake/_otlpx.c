/* Columnar extraction of OTLP ExportTraceServiceRequest protobuf into Arrow-ready buffers.
 *
 *   extract(data: bytes) -> dict | None        one request's columns
 *   Builder().add(data, room=-1) -> int | None  append one request's columns to a group
 *                                               (-1: more spans than `room`; None: nothing added)
 *   Builder().take() -> dict                    the group's columns; the builder starts over
 *   (add parses without the GIL and writes the text of double values once it holds it again;
 *   calls on one Builder must be serialised by the caller, as the committer does under its lock)
 *
 * The order of calls (intake/otlp.py, intake/collect/commit.py): this runs FIRST, on the raw
 * bytes; nothing has parsed them before. It walks the wire format once, checking the tag,
 * wire type and length of every field it reads and the UTF-8 of every string it stores, and
 * fills flat buffers (int32 offsets + UTF-8 data for strings, int64/int32 arrays for
 * numbers) that intake/otlp.py wraps as Arrow arrays without one Python object per span.
 * Anything unusual (malformed wire format or UTF-8, an array or kvlist value this file does
 * not render, a duplicate attribute key, a span that would be rejected, a merged singular
 * sub-message, a time beyond int64) returns None and adds nothing; only then does the caller
 * parse the request with upb and take the exact pure-Python decoder, which also names what
 * was malformed. The fast path never guesses.
 *
 * Attribute values are rendered exactly like tracing.rows.attr_str: str as is, bool as
 * true/false, int as decimal, double as repr(float), bytes as lowercase hex, arrays of
 * scalars as compact JSON (ASCII strings only; anything else falls back).
 *
 * Built by `pip install` as the optional extension intake._otlpx (setup.py); without a C
 * compiler the install goes on and intake.otlp uses its Python decoder.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct { char *p; size_t n, cap; } Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p; b->cap = cap;
    return 0;
}
static int buf_put(Buf *b, const void *src, size_t n) {
    if (buf_reserve(b, n)) return -1;
    memcpy(b->p + b->n, src, n); b->n += n;
    return 0;
}
static int buf_i32(Buf *b, int32_t v) { return buf_put(b, &v, 4); }
static int buf_i64(Buf *b, int64_t v) { return buf_put(b, &v, 8); }

/* a string column: UTF-8 data and int32 offsets (count + 1 entries) */
typedef struct { Buf data, off; int32_t count; } Col;
static int col_init(Col *c) { c->count = 0; return buf_i32(&c->off, 0); }
static int col_end(Col *c) {
    if (c->data.n > INT32_MAX) return -1;
    c->count++;
    return buf_i32(&c->off, (int32_t)c->data.n);
}
static int col_put(Col *c, const char *p, size_t n) {
    if (buf_put(&c->data, p, n)) return -1;
    return col_end(c);
}
static int utf8_ok(const uint8_t *p, size_t n);
/* a proto string field: invalid UTF-8 falls back (upb then rejects the request with its message) */
static int col_text(Col *c, const uint8_t *p, size_t n) {
    if (!utf8_ok(p, n)) return 1;
    return col_put(c, (const char *)p, n) ? -1 : 0;
}
static const char HEX[] = "0123456789abcdef";
static int hex_into(Buf *b, const uint8_t *p, size_t n) {
    if (buf_reserve(b, 2 * n)) return -1;
    char *o = b->p + b->n;
    for (size_t i = 0; i < n; i++) { o[2 * i] = HEX[p[i] >> 4]; o[2 * i + 1] = HEX[p[i] & 15]; }
    b->n += 2 * n;
    return 0;
}
static int col_hex(Col *c, const uint8_t *p, size_t n) {
    if (hex_into(&c->data, p, n)) return -1;
    return col_end(c);
}

/* an attribute list column: per owner an offset into key/value columns */
/* a double attribute value whose text is written once the GIL is held again (Builder.add): Python's
   repr of a double allocates with PyMem, and taking the GIL for each value meant a GIL hand-off per double
   while the other threads ran Python (issue #13). `pos`: where in the value data it goes; `k`: the value */
typedef struct { size_t pos; int32_t k; double d; } Fix;
typedef struct { Fix *p; size_t n, cap; } Fixes;
/* `fx`: NULL renders doubles at once (the GIL is held), else they are recorded there (see Fix) */
typedef struct { Buf off; int32_t owners; Col key, val; Fixes *fx; } Attrs;

/* --- wire format ------------------------------------------------------------------------ */

typedef struct { const uint8_t *p, *end; } Rd;

/* return codes: 0 ok, 1 fall back to the Python decoder, -1 memory error */
#define FALLBACK 1
#define CHECK(x) do { int _r = (x); if (_r) return _r; } while (0)
#define MEM(x) do { if (x) return -1; } while (0)

static int rd_varint(Rd *r, uint64_t *out) {
    uint64_t v = 0; int shift = 0;
    while (r->p < r->end && shift < 64) {
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) { *out = v; return 0; }
        shift += 7;
    }
    return FALLBACK;
}
static int rd_tag(Rd *r, uint32_t *field, uint32_t *wt) {
    uint64_t t;
    CHECK(rd_varint(r, &t));
    *field = (uint32_t)(t >> 3); *wt = (uint32_t)(t & 7);
    return *field == 0 ? FALLBACK : 0; /* field number 0 is invalid: let upb say so */
}
static int rd_len(Rd *r, Rd *sub) {
    uint64_t n;
    CHECK(rd_varint(r, &n));
    if (n > (uint64_t)(r->end - r->p)) return FALLBACK;
    sub->p = r->p; sub->end = r->p + n; r->p += n;
    return 0;
}
static int rd_fixed64(Rd *r, uint64_t *out) {
    if (r->end - r->p < 8) return FALLBACK;
    memcpy(out, r->p, 8); r->p += 8;
    return 0;
}
static int rd_skip(Rd *r, uint32_t wt) {
    uint64_t v; Rd sub;
    switch (wt) {
    case 0: return rd_varint(r, &v);
    case 1: if (r->end - r->p < 8) return FALLBACK; r->p += 8; return 0;
    case 2: return rd_len(r, &sub);
    case 5: if (r->end - r->p < 4) return FALLBACK; r->p += 4; return 0;
    default: return FALLBACK; /* groups: not in OTLP */
    }
}

typedef struct { const uint8_t *p; size_t n; } Str;

/* strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF), as upb checks it */
static int utf8_ok(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        size_t need; uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) { need = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) need = 2;
        else if (c == 0xED) { need = 2; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) need = 2;
        else if (c == 0xF0) { need = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) { need = 3; hi = 0x8F; }
        else return 0;
        if (i + need >= n) return 0;
        if (p[i + 1] < lo || p[i + 1] > hi) return 0;
        for (size_t k = 2; k <= need; k++) if (p[i + k] < 0x80 || p[i + k] > 0xBF) return 0;
        i += need + 1;
    }
    return 1;
}

/* --- values ------------------------------------------------------------------------------- */

static int render_double(Attrs *a, double d, int json) {
    Buf *b = &a->val.data;
    if (json && (d != d || d == 1.0 / 0.0 || d == -1.0 / 0.0)) {
        const char *s = d != d ? "NaN" : (d > 0 ? "Infinity" : "-Infinity");
        return buf_put(b, s, strlen(s));
    }
    if (a->fx) { /* Builder.add: parsing without the GIL; the text goes in at fixes_apply */
        Fixes *fx = a->fx;
        if (fx->n == fx->cap) {
            size_t cap = fx->cap ? fx->cap * 2 : 64;
            Fix *p = realloc(fx->p, cap * sizeof *p);
            if (!p) return -1;
            fx->p = p; fx->cap = cap;
        }
        fx->p[fx->n++] = (Fix){b->n, a->val.count, d};
        return 0;
    }
    /* the GIL is held (extract): Python's own repr */
    char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s) { PyErr_Clear(); return -1; } /* reported as a memory error by the caller */
    int rc = buf_put(b, s, strlen(s));
    PyMem_Free(s);
    return rc;
}
/* with the GIL held: write the text of every double `a` recorded (in order) into its value data, moving
   what follows and the value offsets after it; -1 on a memory error (the caller rolls the body back) */
static int fixes_apply(Attrs *a) {
    Fixes *fx = a->fx;
    if (!fx || !fx->n) return 0;
    size_t n = fx->n, extra = 0;
    char **text = calloc(n, sizeof *text);
    size_t *len = calloc(n, sizeof *len);
    int rc = -1;
    if (!text || !len) goto done;
    for (size_t i = 0; i < n; i++) {
        text[i] = PyOS_double_to_string(fx->p[i].d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (!text[i]) { PyErr_Clear(); goto done; }
        len[i] = strlen(text[i]);
        extra += len[i];
    }
    Buf *d = &a->val.data;
    if (d->n + extra > INT32_MAX || buf_reserve(d, extra)) goto done;
    /* from the last: move the bytes after each insertion point up by what is inserted before them */
    size_t end = d->n, shift = extra;
    for (size_t i = n; i-- > 0;) {
        size_t pos = fx->p[i].pos;
        memmove(d->p + pos + shift, d->p + pos, end - pos);
        shift -= len[i];
        memcpy(d->p + pos + shift, text[i], len[i]);
        end = pos;
    }
    d->n += extra;
    /* offset j ends value j - 1: it grows by the text of every double of values before j */
    int32_t *off = (int32_t *)a->val.off.p;
    size_t f = 0, add = 0;
    for (int32_t j = fx->p[0].k + 1; j <= a->val.count; j++) {
        while (f < n && fx->p[f].k < j) add += len[f++];
        off[j] += (int32_t)add;
    }
    rc = 0;
done:
    if (text) for (size_t i = 0; i < n; i++) PyMem_Free(text[i]);
    free(text);
    free(len);
    fx->n = 0;
    return rc;
}
static int render_int(Buf *b, int64_t v) {
    char tmp[24];
    char *end = tmp + sizeof tmp, *q = end;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { *--q = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) *--q = '-';
    return buf_put(b, q, (size_t)(end - q));
}
static int json_string(Buf *b, Str s) {
    MEM(buf_put(b, "\"", 1));
    for (size_t i = 0; i < s.n; i++) {
        uint8_t c = s.p[i];
        if (c >= 0x80) return FALLBACK; /* json.dumps escapes non-ASCII as \uXXXX: leave to Python */
        if (c == '"') { MEM(buf_put(b, "\\\"", 2)); }
        else if (c == '\\') { MEM(buf_put(b, "\\\\", 2)); }
        else if (c == '\n') { MEM(buf_put(b, "\\n", 2)); }
        else if (c == '\r') { MEM(buf_put(b, "\\r", 2)); }
        else if (c == '\t') { MEM(buf_put(b, "\\t", 2)); }
        else if (c == '\b') { MEM(buf_put(b, "\\b", 2)); }
        else if (c == '\f') { MEM(buf_put(b, "\\f", 2)); }
        else if (c < 0x20 || c == 0x7f) { char t[8]; snprintf(t, sizeof t, "\\u%04x", c); MEM(buf_put(b, t, 6)); }
        else { MEM(buf_put(b, &c, 1)); }
    }
    return buf_put(b, "\"", 1) ? -1 : 0;
}

/* One AnyValue into `b`. json=1 renders as an element of a JSON array. */
static int render_any(Rd r, Attrs *a, int json, int depth);

static int render_array(Rd r, Attrs *a, int depth) {
    Buf *b = &a->val.data;
    if (depth > 0) return FALLBACK; /* nested arrays: Python */
    MEM(buf_put(b, "[", 1));
    int first = 1;
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_len(&r, &sub));
            if (!first) MEM(buf_put(b, ",", 1));
            first = 0;
            CHECK(render_any(sub, a, 1, depth + 1));
        } else {
            return FALLBACK;
        }
    }
    return buf_put(b, "]", 1) ? -1 : 0;
}

static int render_any(Rd r, Attrs *a, int json, int depth) {
    Buf *b = &a->val.data;
    /* the last oneof member set wins, as in protobuf */
    int which = 0; Str s = {0}; uint64_t v = 0; Rd sub = {0};
    while (r.p < r.end) {
        uint32_t f, wt;
        CHECK(rd_tag(&r, &f, &wt));
        if ((f == 1 || f == 7) && wt == 2) { CHECK(rd_len(&r, &sub)); s.p = sub.p; s.n = (size_t)(sub.end - sub.p); which = (int)f; }
        else if ((f == 2 || f == 3) && wt == 0) { CHECK(rd_varint(&r, &v)); which = (int)f; }
        else if (f == 4 && wt == 1) { CHECK(rd_fixed64(&r, &v)); which = 4; }
        else if (f == 5 && wt == 2) {
            if (which == 5) return FALLBACK; /* a repeated message field merges */
            CHECK(rd_len(&r, &sub)); which = 5;
        }
        else if (f == 6 && wt == 2) return FALLBACK; /* kvlist: Python */
        else if (f >= 1 && f <= 7) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    switch (which) {
    case 0: return json ? FALLBACK : 0; /* empty value renders as "" */
    case 1:
        if (json) return json_string(b, s);
        if (!utf8_ok(s.p, s.n)) return FALLBACK;
        return buf_put(b, s.p, s.n) ? -1 : 0;
    case 2: return buf_put(b, v ? "true" : "false", v ? 4 : 5) ? -1 : 0;
    case 3: return render_int(b, (int64_t)v) ? -1 : 0;
    case 4: { double d; memcpy(&d, &v, 8); return render_double(a, d, json) ? -1 : 0; }
    case 5: return json ? FALLBACK : render_array(sub, a, depth);
    case 7:
        if (json) { MEM(buf_put(b, "\"", 1)); MEM(hex_into(b, s.p, s.n)); return buf_put(b, "\"", 1) ? -1 : 0; }
        return hex_into(b, s.p, s.n) ? -1 : 0;
    }
    return FALLBACK;
}

/* KeyValue list of one owner: keys and rendered values; a duplicate key falls back */
static int attr_kv(Rd r, Attrs *a, int32_t first_index) {
    Str key = {0}; Rd val = {0}; int have_val = 0;
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        if (f == 1 && wt == 2) { CHECK(rd_len(&r, &sub)); key.p = sub.p; key.n = (size_t)(sub.end - sub.p); }
        else if (f == 2 && wt == 2) { if (have_val) return FALLBACK; CHECK(rd_len(&r, &val)); have_val = 1; }
        else if (f == 1 || f == 2) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    /* duplicate keys: dict semantics in Python (last value, first position) */
    const int32_t *ko = (const int32_t *)a->key.off.p;
    for (int32_t i = first_index; i < a->key.count; i++) {
        size_t n = (size_t)(ko[i + 1] - ko[i]);
        if (n == key.n && memcmp(a->key.data.p + ko[i], key.p, n) == 0) return FALLBACK;
    }
    CHECK(col_text(&a->key, key.p, key.n));
    if (have_val) CHECK(render_any(val, a, 0, 0));
    MEM(col_end(&a->val));
    return 0;
}
static int attrs_close(Attrs *a) { a->owners++; return buf_i32(&a->off, a->key.count); }

/* --- the output ------------------------------------------------------------------------- */

typedef struct {
    /* spans */
    Col trace, span, parent, state, name, smsg;
    Buf kind, code, start, end, res, scope;
    Attrs attrs;
    Buf ev_off; Buf ev_time; Col ev_name; Attrs ev_attrs;
    Buf ln_off; Col ln_trace, ln_span, ln_state; Attrs ln_attrs;
    /* resources and scopes */
    Attrs res_attrs; int32_t n_res;
    Col scope_name, scope_version; int32_t n_scope;
    int32_t n_spans, n_events, n_links;
    /* while one body is parsed: the sending peer's address, added to each resource lacking PEER_KEY */
    Str peer;
} Out;

static int out_start(Out *o);
static int out_init(Out *o) {
    memset(o, 0, sizeof *o);
    return out_start(o);
}
static int out_start(Out *o) {
    Col *cols[] = {&o->trace, &o->span, &o->parent, &o->state, &o->name, &o->smsg, &o->ev_name, &o->ln_trace,
                   &o->ln_span, &o->ln_state, &o->scope_name, &o->scope_version, &o->attrs.key, &o->attrs.val,
                   &o->ev_attrs.key, &o->ev_attrs.val, &o->ln_attrs.key, &o->ln_attrs.val, &o->res_attrs.key,
                   &o->res_attrs.val};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) MEM(col_init(cols[i]));
    MEM(buf_i32(&o->attrs.off, 0)); MEM(buf_i32(&o->ev_attrs.off, 0)); MEM(buf_i32(&o->ln_attrs.off, 0));
    MEM(buf_i32(&o->res_attrs.off, 0)); MEM(buf_i32(&o->ev_off, 0)); MEM(buf_i32(&o->ln_off, 0));
    return 0;
}
static void out_free(Out *o) {
    Buf *bufs[] = {&o->kind, &o->code, &o->start, &o->end, &o->res, &o->scope, &o->ev_off, &o->ev_time,
                   &o->ln_off, &o->attrs.off, &o->ev_attrs.off, &o->ln_attrs.off, &o->res_attrs.off};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]->p);
    Col *cols[] = {&o->trace, &o->span, &o->parent, &o->state, &o->name, &o->smsg, &o->ev_name, &o->ln_trace,
                   &o->ln_span, &o->ln_state, &o->scope_name, &o->scope_version, &o->attrs.key, &o->attrs.val,
                   &o->ev_attrs.key, &o->ev_attrs.val, &o->ln_attrs.key, &o->ln_attrs.val, &o->res_attrs.key,
                   &o->res_attrs.val};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) { free(cols[i]->data.p); free(cols[i]->off.p); }
}

static int all_zero(Str s) { for (size_t i = 0; i < s.n; i++) if (s.p[i]) return 0; return 1; }

static int attrs_fill(Rd r, uint32_t field, Attrs *a, int32_t first) {
    /* every KeyValue of `field` in message `r` (the owner stays open) */
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        if (f == field && wt == 2) { CHECK(rd_len(&r, &sub)); CHECK(attr_kv(sub, a, first)); }
        else if (f == field) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    return 0;
}
static int attrs_list(Rd r, uint32_t field, Attrs *a) {
    /* every KeyValue of `field` in message `r`, then close the owner */
    CHECK(attrs_fill(r, field, a, a->key.count));
    return attrs_close(a) ? -1 : 0;
}
static int attrs_has(const Attrs *a, int32_t first, const char *key, size_t n) {
    const int32_t *ko = (const int32_t *)a->key.off.p;
    for (int32_t i = first; i < a->key.count; i++)
        if ((size_t)(ko[i + 1] - ko[i]) == n && memcmp(a->key.data.p + ko[i], key, n) == 0) return 1;
    return 0;
}
/* the resource key `collect --record-peer` adds (tracing.schema.ATTR_PEER), as intake.peer.with_peer does */
static const char PEER_KEY[] = "tailscope.peer";

static int parse_event(Rd r, Out *o) {
    uint64_t t = 0; Str name = {0};
    Rd whole = r;
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        if (f == 1 && wt == 1) CHECK(rd_fixed64(&r, &t));
        else if (f == 2 && wt == 2) { CHECK(rd_len(&r, &sub)); name.p = sub.p; name.n = (size_t)(sub.end - sub.p); }
        else if (f == 3 && wt == 2) CHECK(rd_len(&r, &sub));
        else if (f >= 1 && f <= 3) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    if (t > (uint64_t)INT64_MAX) return FALLBACK;
    MEM(buf_i64(&o->ev_time, (int64_t)t));
    CHECK(col_text(&o->ev_name, name.p, name.n));
    CHECK(attrs_list(whole, 3, &o->ev_attrs));
    o->n_events++;
    return 0;
}

static int parse_link(Rd r, Out *o) {
    Str tid = {0}, sid = {0}, st = {0};
    Rd whole = r;
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        if ((f >= 1 && f <= 4) && wt == 2) {
            CHECK(rd_len(&r, &sub));
            Str s = {sub.p, (size_t)(sub.end - sub.p)};
            if (f == 1) tid = s; else if (f == 2) sid = s; else if (f == 3) st = s;
        }
        else if (f >= 1 && f <= 4) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    MEM(col_hex(&o->ln_trace, tid.p, tid.n));
    MEM(col_hex(&o->ln_span, sid.p, sid.n));
    CHECK(col_text(&o->ln_state, st.p, st.n));
    CHECK(attrs_list(whole, 4, &o->ln_attrs));
    o->n_links++;
    return 0;
}

static int parse_span(Rd r, Out *o, int32_t res, int32_t scope) {
    Str tid = {0}, sid = {0}, pid = {0}, st = {0}, name = {0}, msg = {0};
    uint64_t kind = 0, start = 0, end = 0, code = 0;
    int have_status = 0;
    Rd whole = r;
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        switch (f) {
        case 1: case 2: case 3: case 4: case 5:
            if (wt != 2) return FALLBACK;
            CHECK(rd_len(&r, &sub));
            {
                Str s = {sub.p, (size_t)(sub.end - sub.p)};
                if (f == 1) tid = s; else if (f == 2) sid = s; else if (f == 3) st = s;
                else if (f == 4) pid = s; else name = s;
            }
            break;
        case 6: if (wt != 0) return FALLBACK; CHECK(rd_varint(&r, &kind)); break;
        case 7: if (wt != 1) return FALLBACK; CHECK(rd_fixed64(&r, &start)); break;
        case 8: if (wt != 1) return FALLBACK; CHECK(rd_fixed64(&r, &end)); break;
        case 9: case 11: case 13: if (wt != 2) return FALLBACK; CHECK(rd_len(&r, &sub)); break;
        case 15: {
            if (wt != 2 || have_status) return FALLBACK;
            have_status = 1;
            CHECK(rd_len(&r, &sub));
            while (sub.p < sub.end) {
                uint32_t g, gw; Rd s2;
                CHECK(rd_tag(&sub, &g, &gw));
                if (g == 2 && gw == 2) { CHECK(rd_len(&sub, &s2)); msg.p = s2.p; msg.n = (size_t)(s2.end - s2.p); }
                else if (g == 3 && gw == 0) CHECK(rd_varint(&sub, &code));
                else if (g == 2 || g == 3) return FALLBACK;
                else CHECK(rd_skip(&sub, gw));
            }
            break;
        }
        default: CHECK(rd_skip(&r, wt));
        }
    }
    /* spans the Python decoder would reject (or could not store) take the exact slow path */
    if (tid.n != 16 || all_zero(tid) || sid.n != 8 || all_zero(sid) || (pid.n != 0 && pid.n != 8)) return FALLBACK;
    if (end < start || start > (uint64_t)INT64_MAX || end > (uint64_t)INT64_MAX) return FALLBACK;
    MEM(col_hex(&o->trace, tid.p, tid.n));
    MEM(col_hex(&o->span, sid.p, sid.n));
    MEM(col_hex(&o->parent, pid.p, pid.n));
    CHECK(col_text(&o->state, st.p, st.n));
    CHECK(col_text(&o->name, name.p, name.n));
    CHECK(col_text(&o->smsg, msg.p, msg.n));
    MEM(buf_i32(&o->kind, (int32_t)kind));
    MEM(buf_i32(&o->code, (int32_t)code));
    MEM(buf_i64(&o->start, (int64_t)start));
    MEM(buf_i64(&o->end, (int64_t)end));
    MEM(buf_i32(&o->res, res));
    MEM(buf_i32(&o->scope, scope));
    CHECK(attrs_list(whole, 9, &o->attrs));
    /* events and links, in order */
    Rd again = whole;
    while (again.p < again.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&again, &f, &wt));
        if (f == 11 && wt == 2) { CHECK(rd_len(&again, &sub)); CHECK(parse_event(sub, o)); }
        else if (f == 13 && wt == 2) { CHECK(rd_len(&again, &sub)); CHECK(parse_link(sub, o)); }
        else CHECK(rd_skip(&again, wt));
    }
    MEM(buf_i32(&o->ev_off, o->n_events));
    MEM(buf_i32(&o->ln_off, o->n_links));
    o->n_spans++;
    return 0;
}

static int parse_scope_spans(Rd r, Out *o, int32_t res) {
    Str name = {0}, version = {0};
    int have_scope = 0;
    Rd whole = r;
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        if (f == 1 && wt == 2) {
            if (have_scope) return FALLBACK;
            have_scope = 1;
            CHECK(rd_len(&r, &sub));
            while (sub.p < sub.end) {
                uint32_t g, gw; Rd s2;
                CHECK(rd_tag(&sub, &g, &gw));
                if ((g == 1 || g == 2) && gw == 2) {
                    CHECK(rd_len(&sub, &s2));
                    Str s = {s2.p, (size_t)(s2.end - s2.p)};
                    if (g == 1) name = s; else version = s;
                } else if (g == 1 || g == 2) return FALLBACK;
                else CHECK(rd_skip(&sub, gw));
            }
        }
        else if (f == 1) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    int32_t scope = o->n_scope++;
    CHECK(col_text(&o->scope_name, name.p, name.n));
    CHECK(col_text(&o->scope_version, version.p, version.n));
    r = whole;
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        if (f == 2 && wt == 2) { CHECK(rd_len(&r, &sub)); CHECK(parse_span(sub, o, res, scope)); }
        else if (f == 2) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    return 0;
}

static int parse_resource_spans(Rd r, Out *o) {
    int have_res = 0;
    Rd resource = {0};
    Rd whole = r;
    while (r.p < r.end) {
        uint32_t f, wt;
        CHECK(rd_tag(&r, &f, &wt));
        if (f == 1 && wt == 2) { if (have_res) return FALLBACK; have_res = 1; CHECK(rd_len(&r, &resource)); }
        else if (f == 1) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    int32_t res = o->n_res++;
    int32_t first = o->res_attrs.key.count;
    CHECK(attrs_fill(resource, 1, &o->res_attrs, first));
    if (o->peer.p && !attrs_has(&o->res_attrs, first, PEER_KEY, sizeof PEER_KEY - 1)) {
        CHECK(col_text(&o->res_attrs.key, (const uint8_t *)PEER_KEY, sizeof PEER_KEY - 1));
        CHECK(col_text(&o->res_attrs.val, o->peer.p, o->peer.n));
    }
    if (attrs_close(&o->res_attrs)) return -1;
    r = whole;
    while (r.p < r.end) {
        uint32_t f, wt; Rd sub;
        CHECK(rd_tag(&r, &f, &wt));
        if (f == 2 && wt == 2) { CHECK(rd_len(&r, &sub)); CHECK(parse_scope_spans(sub, o, res)); }
        else if (f == 2) return FALLBACK;
        else CHECK(rd_skip(&r, wt));
    }
    return 0;
}

static PyObject *bytes_of(Buf *b) { return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->n); }
static PyObject *col_of(Col *c) { return Py_BuildValue("(NN)", bytes_of(&c->off), bytes_of(&c->data)); }
static PyObject *attrs_of(Attrs *a) {
    return Py_BuildValue("(NNN)", bytes_of(&a->off), col_of(&a->key), col_of(&a->val));
}

static int parse_request(Out *o, const uint8_t *p, Py_ssize_t len) {
    /* extract() keeps the GIL: doubles are rendered at once with PyOS_double_to_string (PyMem allocator) */
    int rc = 0;
    Rd r = {p, p + len};
    while (rc == 0 && r.p < r.end) {
        uint32_t f, wt; Rd sub;
        rc = rd_tag(&r, &f, &wt);
        if (rc) break;
        if (f == 1 && wt == 2) { rc = rd_len(&r, &sub); if (!rc) rc = parse_resource_spans(sub, o); }
        else if (f == 1) rc = FALLBACK;
        else rc = rd_skip(&r, wt);
    }
    return rc;
}

static PyObject *out_dict(Out *o) {
    return Py_BuildValue(
        "{s:i,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N}",
        "n", o->n_spans,
        "trace", col_of(&o->trace), "span", col_of(&o->span), "parent", col_of(&o->parent),
        "state", col_of(&o->state), "name", col_of(&o->name), "smsg", col_of(&o->smsg),
        "kind", bytes_of(&o->kind), "code", bytes_of(&o->code), "start", bytes_of(&o->start),
        "end", bytes_of(&o->end), "res", bytes_of(&o->res), "scope", bytes_of(&o->scope),
        "attrs", attrs_of(&o->attrs),
        "ev_off", bytes_of(&o->ev_off), "ev_time", bytes_of(&o->ev_time), "ev_name", col_of(&o->ev_name),
        "ev_attrs", attrs_of(&o->ev_attrs),
        "ln_off", bytes_of(&o->ln_off), "ln_trace", col_of(&o->ln_trace), "ln_span", col_of(&o->ln_span),
        "ln_state", col_of(&o->ln_state), "ln_attrs", attrs_of(&o->ln_attrs),
        "res_attrs", attrs_of(&o->res_attrs),
        "scope_name", col_of(&o->scope_name), "scope_version", col_of(&o->scope_version));
}

static PyObject *extract(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Out o;
    int rc = out_init(&o);
    if (rc == 0) rc = parse_request(&o, (const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (rc < 0) PyErr_NoMemory();
    else if (rc == FALLBACK) result = Py_NewRef(Py_None);
    else result = out_dict(&o);
    out_free(&o);
    return result;
}

/* --- Builder: many requests into one set of columns (one Arrow assembly per group) ------- */

#define N_BUFS 53
static void out_bufs(Out *o, Buf **b) {
    Buf *list[N_BUFS] = {
        &o->kind, &o->code, &o->start, &o->end, &o->res, &o->scope, &o->ev_off, &o->ev_time, &o->ln_off,
        &o->attrs.off, &o->ev_attrs.off, &o->ln_attrs.off, &o->res_attrs.off,
        &o->trace.data, &o->trace.off, &o->span.data, &o->span.off, &o->parent.data, &o->parent.off,
        &o->state.data, &o->state.off, &o->name.data, &o->name.off, &o->smsg.data, &o->smsg.off,
        &o->ev_name.data, &o->ev_name.off, &o->ln_trace.data, &o->ln_trace.off, &o->ln_span.data, &o->ln_span.off,
        &o->ln_state.data, &o->ln_state.off, &o->scope_name.data, &o->scope_name.off,
        &o->scope_version.data, &o->scope_version.off, &o->attrs.key.data, &o->attrs.key.off,
        &o->attrs.val.data, &o->attrs.val.off, &o->ev_attrs.key.data, &o->ev_attrs.key.off,
        &o->ev_attrs.val.data, &o->ev_attrs.val.off, &o->ln_attrs.key.data, &o->ln_attrs.key.off,
        &o->ln_attrs.val.data, &o->ln_attrs.val.off, &o->res_attrs.key.data, &o->res_attrs.key.off,
        &o->res_attrs.val.data, &o->res_attrs.val.off};
    memcpy(b, list, sizeof list);
}

typedef struct {
    PyObject_HEAD
    Out o;
    int ready;
    Fixes fx[4]; /* the doubles of one body being added, per Attrs (see Fix) */
} Builder;

static int builder_reset(Builder *self) {
    if (!self->ready) {
        if (out_init(&self->o)) { out_free(&self->o); PyErr_NoMemory(); return -1; }
        self->ready = 1;
        return 0;
    }
    /* keep the buffers (take() copied their contents): no fresh pages for the next group */
    Buf *now[N_BUFS];
    out_bufs(&self->o, now);
    Buf keep[N_BUFS];
    for (int i = 0; i < N_BUFS; i++) { keep[i] = *now[i]; keep[i].n = 0; }
    memset(&self->o, 0, sizeof self->o);
    out_bufs(&self->o, now);
    for (int i = 0; i < N_BUFS; i++) *now[i] = keep[i];
    if (out_start(&self->o)) { PyErr_NoMemory(); return -1; }
    return 0;
}

static int Builder_init(Builder *self, PyObject *args, PyObject *kwds) { return builder_reset(self); }

static void Builder_dealloc(Builder *self) {
    if (self->ready) out_free(&self->o);
    for (int i = 0; i < 4; i++) free(self->fx[i].p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* add(data, room=-1, peer=None) -> spans added; None when nothing was added because the body needs
   the Python decoder; -1 when nothing was added because the body holds more than `room` spans.
   `peer` (str): added to every resource of the body lacking tailscope.peer, as intake.peer.with_peer */
static PyObject *Builder_add(Builder *self, PyObject *args) {
    Py_buffer view;
    long room = -1;
    const char *peer = NULL; Py_ssize_t peer_n = 0;
    if (!PyArg_ParseTuple(args, "y*|lz#", &view, &room, &peer, &peer_n)) return NULL;
    if (!self->ready) { PyBuffer_Release(&view); PyErr_SetString(PyExc_RuntimeError, "Builder not initialised"); return NULL; }
    Out *o = &self->o;
    Buf *bufs[N_BUFS];
    out_bufs(o, bufs);
    size_t sizes[N_BUFS];
    for (int i = 0; i < N_BUFS; i++) sizes[i] = bufs[i]->n;
    Out saved = *o; /* counters; buffer contents are restored by size below */
    o->peer.p = (const uint8_t *)peer; o->peer.n = (size_t)peer_n;
    Attrs *with_doubles[4] = {&o->attrs, &o->ev_attrs, &o->ln_attrs, &o->res_attrs};
    for (int i = 0; i < 4; i++) { self->fx[i].n = 0; with_doubles[i]->fx = &self->fx[i]; }
    int rc;
    /* the parse touches only this builder's C buffers (its caller serialises add and take), so other
       threads run Python meanwhile: the receiver's segment work overlaps the extraction of the next body */
    Py_BEGIN_ALLOW_THREADS
    rc = parse_request(o, (const uint8_t *)view.buf, view.len);
    Py_END_ALLOW_THREADS
    o->peer.p = NULL; o->peer.n = 0; saved.peer = o->peer;
    PyBuffer_Release(&view);
    for (int i = 0; i < 4; i++) {  /* the GIL is held again: the doubles' text */
        if (rc == 0 && fixes_apply(with_doubles[i])) rc = -1;
        self->fx[i].n = 0;
        with_doubles[i]->fx = NULL;
    }
    long added = (long)(o->n_spans - saved.n_spans);
    if (rc == 0 && (room < 0 || added <= room)) return PyLong_FromLong(added);
    /* roll back: keep the (possibly reallocated) buffers, restore sizes and counters */
    Buf *now[N_BUFS];
    out_bufs(o, now);
    Buf keep[N_BUFS];
    for (int i = 0; i < N_BUFS; i++) keep[i] = *now[i];
    *o = saved;
    out_bufs(o, now);
    for (int i = 0; i < N_BUFS; i++) { *now[i] = keep[i]; now[i]->n = sizes[i]; }
    if (rc < 0) return PyErr_NoMemory();
    if (rc == 0) return PyLong_FromLong(-1);
    Py_RETURN_NONE;
}

/* take() -> the columns of every span added since the last take (a dict as extract() gives) */
static PyObject *Builder_take(Builder *self, PyObject *noargs) {
    if (!self->ready) { PyErr_SetString(PyExc_RuntimeError, "Builder not initialised"); return NULL; }
    PyObject *d = out_dict(&self->o);
    if (!d) return NULL;
    if (builder_reset(self)) { Py_DECREF(d); return NULL; }
    return d;
}

static PyObject *Builder_len(Builder *self, void *closure) { return PyLong_FromLong(self->ready ? self->o.n_spans : 0); }

static PyMethodDef builder_methods[] = {
    {"add", (PyCFunction)Builder_add, METH_VARARGS,
     "add(data, room=-1) -> spans added; None: use the Python decoder; -1: more than room spans (nothing added)"},
    {"take", (PyCFunction)Builder_take, METH_NOARGS, "take() -> columns of every span added since the last take"},
    {NULL, NULL, 0, NULL},
};
static PyGetSetDef builder_getset[] = {
    {"spans", (getter)Builder_len, NULL, "spans added since the last take", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "intake._otlpx.Builder",
    .tp_basicsize = sizeof(Builder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Accumulates the columns of many requests; not thread-safe (callers lock).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Builder_init,
    .tp_dealloc = (destructor)Builder_dealloc,
    .tp_methods = builder_methods,
    .tp_getset = builder_getset,
};

static PyMethodDef methods[] = {
    {"extract", extract, METH_O, "extract(data) -> dict of Arrow-ready buffers, or None to use the Python decoder"},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpx", NULL, -1, methods};
PyMODINIT_FUNC PyInit__otlpx(void) {
    if (PyType_Ready(&BuilderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&BuilderType);
    if (PyModule_AddObject(m, "Builder", (PyObject *)&BuilderType) < 0) { Py_DECREF(&BuilderType); Py_DECREF(m); return NULL; }
    return m;
}
