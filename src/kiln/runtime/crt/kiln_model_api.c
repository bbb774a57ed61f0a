/*
 * The Kiln model C API (kiln/kiln_model.h), driven by a model's generated tables (kiln_model_desc.h).
 *
 * Compiled into every library that holds a CPU graph, next to the generated kiln_model.c (which
 * defines the tables and KilnModelCreate). It does what kiln.runtime's graph executor does for a
 * CPU graph -- one buffer per storage slot, a DLTensor per entry, the kernel calls bound once at
 * creation and dispatched by KilnRunSequence -- without reading the graph JSON: the order, shapes
 * and names are in the tables. Weights come from the library's module blob (the factory's params
 * section, docs/module_blob_format.md + docs/params_format.md) or from a params file.
 *
 * Everything read from a file or the blob is bounds-checked; a failure sets the thread's last
 * error (KilnGetLastError) naming what was wrong and returns a KilnStatus, never aborts.
 *
 * Dynamic dimensions (docs/c_api.md "Dynamic shapes"), as kiln.runtime.dynamic_shapes does it:
 * storage stays planned for the upper bounds (the padded layout: an entry of actual shape a holds
 * its data in the sub-box [0:a0, 0:a1, ...], strides never change). Setting an input checks its
 * shape against the symbols' ranges, takes the symbols' values from it and copies the data into
 * the sub-box; a run first checks that the inputs agree on every symbol, then -- only when a symbol
 * changed -- evaluates every symbolic dim (the tables' eval_dims) and writes the actual shapes into
 * the entries' DLTensors, from which the kernels read their extents. The 1-D `flat` twins keep the
 * padded element count, as in the Python executor.
 *
 * Data-dependent dims (NonZero's count ...; tables version 3): a kernel reports the extent it decided
 * by writing it into the shape of its output DLTensor (kiln.tir.set_extent), and later kernels must
 * see it. So, as kiln.runtime.graph_executor does, a run of kernel calls ends after each reporting
 * kernel; the value is read back, checked against the symbol's range, and every entry re-shaped
 * before the next kernel. Models without such kernels take the same single KilnRunSequence call.
 * Until its kernel reports it in this run, a data-dependent symbol holds the last run's value, so a
 * dim that uses it (the tables' dim_expr_after) is neither checked nor written: `n-nonzero_0` with
 * a new, smaller n and the old count may be negative, and no kernel reads it before the count is
 * known (the Python executor writes it unchecked).
 *
 * Runtime control flow (tables version 4; kiln.runtime.control_flow is the Python twin): every
 * nested graph of an `__if` / `__loop` op (a branch, a body; recursively) is an instance of its own,
 * created with its parent and freed with it. The op runs at its position in the op sequence (the
 * kernel runs are split around it, as around a reporting kernel): the nested instance's arguments
 * are bound zero copy to the parent's entries (data pointers set before each run: the parent's may
 * be bound themselves), it runs its own op sequence, and its results are copied into the op's
 * outputs -- a result that is a bound argument's memory is snapshotted first, so a body that swaps
 * two carried values stays right. A loop keeps its carried values in the op's outputs (the body's
 * carried arguments are bound to them), writes the iteration number and condition into the body's
 * own memory, copies iteration i's scan results into row i of each scan output and finally writes
 * the iteration count into their leading dim: a data-dependent symbol this op reports, taken like a
 * kernel's. A nested graph of a dynamic model declares the parent's symbols (same ranges, so the
 * same upper-bound storage and padded layout on both sides): before each run it takes their current
 * values (re-shaping its entries only when one changed), and every copy moves the valid sub-box
 * only (box_move), so a small shape under large bounds does not move the whole buffer.
 */
#define _GNU_SOURCE
#include <kiln/kiln_model_desc.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KILN_HIDDEN __attribute__((visibility("hidden")))

/* KilnErrorf (kiln_crt.c) records the message and returns -1; keep the status code instead. */
#define FAIL(status, ...) (KilnErrorf(__VA_ARGS__), (int32_t)(status))

static const uint64_t kParamsMagic = 0xF7E58D4F05049CB7ULL;
static const uint64_t kTensorMagic = 0xDD5E40F096B4A13FULL;
static const char kFactoryKey[] = "GraphExecutorFactory";

/* A data-dependent symbol: after op `op` ran, its value is dim `dim` of entry `entry`'s shape. */
typedef struct {
  int32_t op, symbol, entry, dim;
} KilnReport;

/* A nested graph's instance within a control-flow op. */
typedef struct {
  KilnModel* model;
  const KilnNestedDesc* desc;
  int64_t* snap_at;       /* per output (head): its offset in `scratch` if it is bound memory, else -1 */
  char* scratch;          /* snapshots of those heads, taken before any result is written back */
} KilnNested;

typedef struct {
  const KilnControlDesc* desc;
  KilnNested nested[2];
  int64_t bound;          /* a loop's scan outputs' planned rows (-1: no scan outputs) */
} KilnControl;

/* Nested graphs deeper than this are a damaged table (the graph JSON reader allows 6 levels). */
#define KILN_MAX_NESTING 16

struct KilnModel {
  const KilnModelDesc* desc;
  pthread_mutex_t mu;
  void** storage;         /* one 64-byte aligned buffer per storage slot */
  DLTensor* tensors;      /* per entry */
  DLTensor* flat;         /* per entry: the same memory as a 1-D tensor (flatten_data kernels) */
  int64_t* flat_shape;    /* per entry: its element count */
  KilnValue* values;      /* per op argument */
  int32_t* codes;
  KilnOpCall* calls;      /* per op (a copy's slot is unused) */
  uint8_t* input_set;     /* per input */
  /* dynamic dimensions (desc->num_symbols > 0; all NULL otherwise) */
  int64_t* shapes;        /* every entry's actual dims, laid out as desc->shapes; the DLTensors' shape arrays */
  int64_t* strides;       /* padded-layout strides (of the upper bounds) of the dynamic entries */
  int64_t* sym;           /* symbol values, as the inputs last set them */
  int64_t* applied;       /* symbol values `shapes` were computed for */
  int32_t* sym_from;      /* per symbol: the input that last gave its value */
  int64_t* dim_values;    /* per dim expression, scratch of eval_dims */
  int64_t* in_shapes;     /* the shape each input was set with ... */
  int32_t* in_shape_at;   /* ... starting here in in_shapes */
  int dirty;              /* an input was set since the shapes were last checked */
  int partial;            /* the last apply_symbols left dims that use unreported symbols unwritten */
  KilnReport* reports;    /* data-dependent symbols, by op: what to read back after which kernel */
  int32_t num_reports;
  /* runtime control flow (tables version 4; NULL otherwise) */
  KilnControl* controls;  /* per KilnModelDesc.controls row */
  int32_t num_controls;   /* rows set up so far (KilnModelFree frees those) */
  int32_t* control_of;    /* per op: its row in controls, -1 for a kernel or a copy */
};

static int32_t create_model(const KilnModelDesc* d, const char* params_path, KilnModel** out, int depth);
static int32_t run_ops(KilnModel* m);

KILN_DLL int32_t KilnModelAPIVersion(void) { return KILN_MODEL_API_VERSION; }

/* ---------------- bounded little-endian reading ---------------- */
typedef struct {
  const uint8_t* p;
  uint64_t n, pos;
  const char* what; /* "params file 'x.params'", "the library's module blob" */
  int in_blob;      /* the params a library carries (not a file the caller named) */
} Cursor;

static int cur_u64(Cursor* c, uint64_t* v) {
  if (c->n - c->pos < 8) return 0;
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | c->p[c->pos + (uint64_t)i];
  *v = x;
  c->pos += 8;
  return 1;
}

static int cur_skip(Cursor* c, uint64_t k) {
  if (c->n - c->pos < k) return 0;
  c->pos += k;
  return 1;
}

static int32_t truncated(const Cursor* c, const char* field) {
  return FAIL(KILN_ERR_FORMAT, "%s: truncated at byte %llu while reading %s", c->what,
              (unsigned long long)c->pos, field);
}

static int64_t le_i64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | p[i];
  return (int64_t)x;
}

static const char* dtype_text(DLDataType t, char* buf, size_t n) { return KilnDTypeText(t.code, t.bits, 1, buf, n); }

/* ---------------- dynamic dimensions: helpers ---------------- */
static size_t item_bytes(DLDataType t) { return ((size_t)t.bits * (t.lanes ? t.lanes : 1) + 7) / 8; }

/* The expression giving dim k of entry e, or -1 for a static dim. */
static int32_t dim_expr(const KilnModelDesc* d, const KilnEntryDesc* e, int32_t k) {
  return d->dim_expr ? d->dim_expr[e->shape_offset + k] : -1;
}

static int entry_dynamic(const KilnModelDesc* d, const KilnEntryDesc* e) {
  for (int32_t k = 0; k < e->ndim; ++k)
    if (dim_expr(d, e, k) >= 0) return 1;
  return 0;
}

/* An entry's dims as the graph writes them: "(batch, 16)". */
static const char* dims_text(const KilnModelDesc* d, const KilnEntryDesc* e, char* buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int32_t i = 0; i < e->ndim && k < n; ++i) {
    int32_t x = dim_expr(d, e, i);
    if (x >= 0) k += (size_t)snprintf(buf + k, n - k, i ? ", %s" : "%s", d->dim_exprs[x].text);
    else k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)d->shapes[e->shape_offset + i]);
  }
  if (k < n) snprintf(buf + k, n - k, e->ndim == 1 ? ",)" : ")");
  return buf;
}

/* Walks the valid sub-box [0:a0, 0:a1, ...] of the padded layout of upper-bound shape u (row-major):
 * the trailing dims that are whole move as one block per outer index. Each side is either a padded
 * buffer (blocks at their padded offsets) or compact data of shape a (blocks back to back);
 * memmove, since both padded sides of a control-flow copy may be one buffer. */
static void box_walk(char* dst, const char* src, int dst_padded, int src_padded, const int64_t* a,
                     const int64_t* u, int32_t ndim, size_t item) {
  size_t run = item, stride[64];
  int64_t idx[64];
  if (ndim > 64) return;
  int32_t k = ndim - 1;
  for (; k >= 0 && a[k] == u[k]; --k) run *= (size_t)u[k];
  if (k >= 0) run *= (size_t)a[k];
  for (int32_t i = 0; i < k; ++i)
    if (a[i] <= 0) return;
  if (run == 0) return;
  size_t s = item, off = 0, flat = 0;
  for (int32_t i = ndim - 1; i >= 0; --i) {
    stride[i] = s;
    s *= (size_t)u[i];
    idx[i] = 0;
  }
  for (;;) {
    memmove(dst + (dst_padded ? off : flat), src + (src_padded ? off : flat), run);
    flat += run;
    int32_t i = k - 1;
    for (; i >= 0 && ++idx[i] == a[i]; --i) {
      off -= (size_t)(a[i] - 1) * stride[i];
      idx[i] = 0;
    }
    if (i < 0) break;
    off += stride[i];
  }
}

/* Copies between compact row-major data of shape a and the padded layout of upper-bound shape u:
 * compact -> padded when to_padded, else back. */
static void box_copy(char* padded, char* compact, const int64_t* a, const int64_t* u, int32_t ndim, size_t item,
                     int to_padded) {
  if (to_padded) box_walk(padded, compact, 1, 0, a, u, ndim, item);
  else box_walk(compact, padded, 0, 1, a, u, ndim, item);
}

/* Copy the valid sub-box of an entry between two buffers of the same padded layout (`nbytes` in
 * all): what control flow copies of a dynamic entry, so that a small shape under large bounds does
 * not move the whole buffer. */
static void box_move(char* dst, const char* src, const int64_t* a, const int64_t* u, int32_t ndim, size_t item,
                     uint64_t nbytes) {
  if (dst == src) return;
  if (ndim > 64) { /* never planned (at most 32 dims); the whole buffer then */
    if (nbytes) memmove(dst, src, (size_t)nbytes);
    return;
  }
  box_walk(dst, src, 1, 1, a, u, ndim, item);
}

/* Whether dim expression x is known once the reports of ops up to `known` were taken in this run
 * (-1: none yet; INT32_MAX: every symbol holds a value of its own, as at creation). */
static int expr_known(const KilnModelDesc* d, int32_t x, int32_t known) {
  return !d->dim_expr_after || d->dim_expr_after[x] <= known;
}

/* If a symbol changed since the shapes were written (or some were left unwritten): evaluate every
 * dim expression (unless the caller just did) and write every entry's actual dims, none past its
 * planned upper bound (else nothing is written). Dims using a data-dependent symbol not reported
 * yet in this run (expr_known) are skipped: neither checked nor written. Lock held, or the
 * instance not yet shared. */
static int32_t apply_symbols(KilnModel* m, const char* fn, int evaluated, int32_t known) {
  const KilnModelDesc* d = m->desc;
  if (!m->partial && memcmp(m->sym, m->applied, sizeof(int64_t) * (size_t)d->num_symbols) == 0) return KILN_OK;
  if (!evaluated) d->eval_dims(m->sym, m->dim_values);
  for (int32_t eid = 0; eid < d->num_entries; ++eid) {
    const KilnEntryDesc* e = &d->entries[eid];
    for (int32_t k = 0; k < e->ndim; ++k) {
      int32_t x = dim_expr(d, e, k);
      if (x < 0 || !expr_known(d, x, known)) continue;
      int64_t v = m->dim_values[x], hi = d->shapes[e->shape_offset + k];
      if (v < 0 || v > hi)
        return FAIL(KILN_ERR_SHAPE, "%s: dim %d of graph entry %d, %s, is %lld, outside 0..%lld (its planned "
                    "storage)", fn, (int)k, (int)eid, d->dim_exprs[x].text, (long long)v, (long long)hi);
    }
  }
  int skipped = 0;
  for (int32_t eid = 0; eid < d->num_entries; ++eid) {
    const KilnEntryDesc* e = &d->entries[eid];
    for (int32_t k = 0; k < e->ndim; ++k) {
      int32_t x = dim_expr(d, e, k);
      if (x < 0) continue;
      if (expr_known(d, x, known)) m->shapes[e->shape_offset + k] = m->dim_values[x];
      else skipped = 1;
    }
  }
  m->partial = skipped;
  memcpy(m->applied, m->sym, sizeof(int64_t) * (size_t)d->num_symbols);
  return KILN_OK;
}

/* Evaluate every dim expression at the current symbol values; check that each dynamic input's
 * shape is what they make it (the inputs agree); then apply them (apply_symbols, `known` as
 * there). A refused run leaves `dirty` set, so the next one checks again. Lock held, or the
 * instance not yet shared. */
static int32_t update_shapes(KilnModel* m, const char* fn, int check_inputs, int32_t known) {
  const KilnModelDesc* d = m->desc;
  d->eval_dims(m->sym, m->dim_values);
  for (int32_t i = 0; i < d->num_inputs && check_inputs; ++i) {
    const KilnEntryDesc* e = &d->entries[d->inputs[i].entry];
    const int64_t* given = m->in_shapes + m->in_shape_at[i];
    int64_t want[64];
    char why[320], a[160], b[160];
    size_t n = 0;
    why[0] = 0;
    for (int32_t k = 0; k < e->ndim && k < 64; ++k) {
      int32_t x = dim_expr(d, e, k);
      want[k] = x >= 0 ? m->dim_values[x] : d->shapes[e->shape_offset + k];
      if (x < 0 || want[k] == given[k] || n >= sizeof why) continue;
      const KilnDimExprDesc* ex = &d->dim_exprs[x];
      n += (size_t)snprintf(why + n, sizeof why - n, "%s%s = %lld (from input '%s')", n ? ", " : "", ex->text,
                            (long long)want[k],
                            m->sym_from[ex->symbol] >= 0 ? d->inputs[m->sym_from[ex->symbol]].name : "a kernel");
    }
    if (why[0])
      return FAIL(KILN_ERR_SHAPE, "%s: inconsistent input shapes: input '%s' has shape %s, but %s makes it %s", fn,
                  d->inputs[i].name, KilnShapeText(e->ndim, given, a, sizeof a), why,
                  KilnShapeText(e->ndim, want, b, sizeof b));
  }
  int32_t s = apply_symbols(m, fn, 1, known);
  if (s == KILN_OK) m->dirty = 0;
  return s;
}

/* Undo what op `op`'s kernel wrote into its arguments' shapes: every dim that is a symbol gets the
 * value the shapes were last written for. Dim expression x < num_symbols is symbol x itself: a
 * promise of the generator (model_api._dynamic_tables) that KilnModelCreate checks (check_dim_exprs). */
static void restore_reported(KilnModel* m, int32_t op) {
  const KilnModelDesc* d = m->desc;
  const KilnOpDesc* o = &d->ops[op];
  for (int32_t a = 0; a < o->num_args; ++a) {
    const KilnEntryDesc* e = &d->entries[d->op_args[o->first_arg + a]];
    for (int32_t k = 0; k < e->ndim; ++k) {
      int32_t x = dim_expr(d, e, k);
      if (x >= 0 && x < d->num_symbols) m->shapes[e->shape_offset + k] = m->applied[x];
    }
  }
}

/* After reports[r0..r1) 's kernel (one op) ran: read each data-dependent dim it reported, check it
 * against the symbol's range and re-shape every entry. A value out of range (or one that would put
 * a dim past its storage) keeps the symbols' previous values and the shapes they give, the
 * kernel's writes undone, so that the instance runs again normally. Lock held. */
static int32_t take_reports(KilnModel* m, int32_t r0, int32_t r1) {
  const KilnModelDesc* d = m->desc;
  const KilnOpDesc* op = &d->ops[m->reports[r0].op];
  for (int32_t r = r0; r < r1; ++r) {
    const KilnReport* p = &m->reports[r];
    const KilnSymbolDesc* y = &d->symbols[p->symbol];
    int64_t v = m->shapes[d->entries[p->entry].shape_offset + p->dim];
    if (v < y->lo || v > y->hi) {
      restore_reported(m, p->op);
      return FAIL(KILN_ERR_SHAPE, "KilnModelRun: graph node '%s', function '%s': data-dependent dimension '%s' "
                  "came out as %lld, outside its range %lld..%lld (graph entry %d, dim %d)", op->name, op->func_name,
                  y->name, (long long)v, (long long)y->lo, (long long)y->hi, (int)p->entry, (int)p->dim);
    }
  }
  for (int32_t r = r0; r < r1; ++r) {
    const KilnReport* p = &m->reports[r];
    m->sym[p->symbol] = m->shapes[d->entries[p->entry].shape_offset + p->dim];
  }
  int32_t s = apply_symbols(m, "KilnModelRun", 0, m->reports[r0].op);
  if (s != KILN_OK) {
    for (int32_t r = r0; r < r1; ++r) m->sym[m->reports[r].symbol] = m->applied[m->reports[r].symbol];
    restore_reported(m, m->reports[r0].op);
  }
  return s;
}

/* ---------------- params (docs/params_format.md) ---------------- */
static int32_t find_param(const KilnModelDesc* d, const char* name, uint64_t len) {
  for (int32_t i = 0; i < d->num_params; ++i)
    if (strlen(d->params[i].name) == len && memcmp(d->params[i].name, name, len) == 0) return i;
  return -1;
}

/* Copies every tensor of a params dict into its param entry; every param must be present. */
static int32_t load_params(KilnModel* m, Cursor* c) {
  const KilnModelDesc* d = m->desc;
  uint64_t magic, reserved, count;
  if (!cur_u64(c, &magic)) return truncated(c, "the params magic");
  if (magic != kParamsMagic)
    return FAIL(KILN_ERR_FORMAT, "%s: not a params dict (magic 0x%016llx, expected 0x%016llx)", c->what,
                (unsigned long long)magic, (unsigned long long)kParamsMagic);
  if (!cur_u64(c, &reserved) || !cur_u64(c, &count)) return truncated(c, "the params header");
  if (count == 0 && d->num_params > 0 && c->in_blob)
    return FAIL(KILN_ERR_ARGUMENT, "KilnModelCreate: model '%s' has %d params but the library was exported without "
                "them (remove_params); pass a params file", d->mod_name, (int)d->num_params);
  if (count > c->n / 8) return FAIL(KILN_ERR_FORMAT, "%s: implausible tensor count %llu", c->what,
                                    (unsigned long long)count);
  /* Names first, then tensors in the same order: remember where each name is. */
  uint64_t names_at = c->pos;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t len;
    if (!cur_u64(c, &len) || !cur_skip(c, len)) return truncated(c, "a param name");
  }
  uint64_t tensors;
  if (!cur_u64(c, &tensors)) return truncated(c, "the tensor count");
  if (tensors != count)
    return FAIL(KILN_ERR_FORMAT, "%s: %llu names but %llu tensors", c->what, (unsigned long long)count,
                (unsigned long long)tensors);
  uint8_t* seen = calloc((size_t)d->num_params + 1, 1);
  if (!seen) return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: out of memory");
  Cursor names = *c;
  names.pos = names_at;
  int32_t status = KILN_OK;
  char a[160], b[160];
  for (uint64_t i = 0; i < count && status == KILN_OK; ++i) {
    uint64_t len = 0;
    cur_u64(&names, &len);
    const char* name = (const char*)names.p + names.pos;
    names.pos += len;
    uint64_t tmagic, tres, nbytes = 0;
    if (!cur_u64(c, &tmagic) || !cur_u64(c, &tres) || c->n - c->pos < 16) {
      status = truncated(c, "a tensor header");
      break;
    }
    if (tmagic != kTensorMagic) {
      status = FAIL(KILN_ERR_FORMAT, "%s: tensor %llu ('%.*s') has a bad magic number", c->what,
                    (unsigned long long)i, (int)(len > 100 ? 100 : len), name);
      break;
    }
    const uint8_t* h = c->p + c->pos;
    int32_t ndim = (int32_t)((uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24);
    DLDataType dt = {h[12], h[13], (uint16_t)(h[14] | h[15] << 8)};
    c->pos += 16;
    if (ndim < 0 || ndim > 64 || c->n - c->pos < (uint64_t)ndim * 8 + 8) {
      status = truncated(c, "a tensor shape");
      break;
    }
    int64_t shape[64];
    for (int32_t k = 0; k < ndim; ++k) shape[k] = le_i64(c->p + c->pos + 8 * (uint64_t)k);
    c->pos += (uint64_t)ndim * 8;
    cur_u64(c, &nbytes);
    if (c->n - c->pos < nbytes) {
      status = truncated(c, "tensor data");
      break;
    }
    int32_t p = find_param(d, name, len);
    if (p < 0) {
      status = FAIL(KILN_ERR_FORMAT, "%s: '%.*s' is not a param of model '%s' (it has %d params)", c->what,
                    (int)(len > 100 ? 100 : len), name, d->mod_name, (int)d->num_params);
      break;
    }
    const KilnEntryDesc* e = &d->entries[d->params[p].entry];
    const int64_t* want = d->shapes + e->shape_offset;
    int same = ndim == e->ndim && nbytes == e->nbytes;
    for (int32_t k = 0; same && k < ndim; ++k) same = shape[k] == want[k];
    if (dt.code == kDLUInt && dt.bits == 1) dt.code = kDLBool, dt.bits = 8; /* TVM's bool spelling */
    if (!same || dt.code != e->dtype.code || dt.bits != e->dtype.bits) {
      char c1[32], c2[32];
      status = FAIL(KILN_ERR_SHAPE, "%s: param '%s' is %s %s, the model expects %s %s", c->what,
                    d->params[p].name, dtype_text(dt, c1, sizeof c1), KilnShapeText(ndim, shape, a, sizeof a),
                    dtype_text(e->dtype, c2, sizeof c2), KilnShapeText(e->ndim, want, b, sizeof b));
      break;
    }
    memcpy(m->tensors[d->params[p].entry].data, c->p + c->pos, (size_t)nbytes);
    c->pos += nbytes;
    seen[p] = 1;
  }
  for (int32_t p = 0; p < d->num_params && status == KILN_OK; ++p)
    if (!seen[p])
      status = FAIL(KILN_ERR_FORMAT, "%s: param '%s' of model '%s' is missing", c->what, d->params[p].name,
                    d->mod_name);
  free(seen);
  return status;
}

/* The params section of this model's GraphExecutorFactory entry in the module blob. */
static int32_t blob_params(const KilnModelDesc* d, Cursor* out) {
  Cursor c = {d->blob, 8, 0, "the library's module blob", 1};
  uint64_t len, count;
  cur_u64(&c, &len);
  c.n = 8 + len;
  if (!cur_u64(&c, &count)) return truncated(&c, "the entry count");
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t klen;
    if (!cur_u64(&c, &klen) || c.n - c.pos < klen) return truncated(&c, "a type key");
    const char* key = (const char*)c.p + c.pos;
    c.pos += klen;
    if (klen == 4 && memcmp(key, "_lib", 4) == 0) continue;
    if (klen == 12 && memcmp(key, "_import_tree", 12) == 0) {
      for (int v = 0; v < 2; ++v) {
        uint64_t k;
        if (!cur_u64(&c, &k) || k > (c.n - c.pos) / 8 || !cur_skip(&c, 8 * k)) return truncated(&c, "the import tree");
      }
      continue;
    }
    uint64_t plen;
    if (!cur_u64(&c, &plen) || c.n - c.pos < plen) return truncated(&c, "an entry payload");
    Cursor p = {c.p + c.pos, plen, 0, c.what, 1};
    c.pos += plen;
    if (klen != sizeof(kFactoryKey) - 1 || memcmp(key, kFactoryKey, klen) != 0) continue;
    uint64_t glen, nlen, params_len;
    if (!cur_u64(&p, &glen) || !cur_skip(&p, glen) || !cur_u64(&p, &nlen) || p.n - p.pos < nlen)
      return truncated(&p, "the factory payload");
    int ours = nlen == strlen(d->mod_name) && memcmp(p.p + p.pos, d->mod_name, nlen) == 0;
    p.pos += nlen;
    if (!ours) continue;
    if (!cur_u64(&p, &params_len) || p.n - p.pos < params_len) return truncated(&p, "the params section");
    out->p = p.p + p.pos;
    out->n = params_len;
    out->pos = 0;
    out->what = "the params in the library's module blob";
    out->in_blob = 1;
    return KILN_OK;
  }
  return FAIL(KILN_ERR_FORMAT, "the library's module blob has no executor factory named '%s'", d->mod_name);
}

static int32_t read_file(const char* path, uint8_t** data, uint64_t* n) {
  FILE* f = fopen(path, "rb");
  if (!f) return FAIL(KILN_ERR_IO, "params file '%s' cannot be opened", path);
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return FAIL(KILN_ERR_IO, "params file '%s' cannot be read (not a regular file?)", path);
  }
  *data = malloc(size > 0 ? (size_t)size : 1);
  if (!*data) {
    fclose(f);
    return FAIL(KILN_ERR_MEMORY, "params file '%s': out of memory for %ld bytes", path, size);
  }
  size_t got = fread(*data, 1, (size_t)size, f);
  fclose(f);
  if (got != (size_t)size) {
    free(*data);
    return FAIL(KILN_ERR_IO, "params file '%s': read %zu of %ld bytes", path, got, size);
  }
  *n = (uint64_t)size;
  return KILN_OK;
}

/* What the C side relies on in a dynamic model's expression tables, which the generator
 * (model_api._dynamic_tables) guarantees: expression j < num_symbols is symbol j itself
 * (restore_reported), and version-3 tables say per expression after which kernel it is known. */
static int32_t check_dim_exprs(const KilnModelDesc* d) {
  if (d->num_dim_exprs < d->num_symbols)
    return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: %d dim expressions for %d symbols (each symbol is one)",
                (int)d->num_dim_exprs, (int)d->num_symbols);
  for (int32_t j = 0; j < d->num_symbols; ++j)
    if (d->dim_exprs[j].symbol != j || strcmp(d->dim_exprs[j].text, d->symbols[j].name) != 0)
      return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: dim expression %d is '%s', not symbol %d '%s' itself", (int)j,
                  d->dim_exprs[j].text, (int)j, d->symbols[j].name);
  if (d->api_version < 3) return KILN_OK;
  int data = 0;
  for (int32_t j = 0; j < d->num_symbols; ++j) data |= d->symbols[j].input == -1;
  if (!d->dim_expr_after && (d->api_version == 3 || data))
    return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: version-%d tables without dim_expr_after", (int)d->api_version);
  if (!d->dim_expr_after) return KILN_OK; /* version 4 without data-dependent symbols */
  for (int32_t x = 0; x < d->num_dim_exprs; ++x)
    if (d->dim_expr_after[x] < -1 || d->dim_expr_after[x] >= d->num_ops)
      return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: dim expression '%s' is known after op %d, not one of the "
                  "model's %d ops", d->dim_exprs[x].text, (int)d->dim_expr_after[x], (int)d->num_ops);
  return KILN_OK;
}

/* Where each symbol's value comes from: an input's dim, a kernel (-1, checked by find_reports) or,
 * in a nested graph of version-4 tables only, the enclosing graph (-2, checked by create_nested). */
static int32_t check_symbols(const KilnModelDesc* d, int depth) {
  for (int32_t j = 0; j < d->num_symbols; ++j) {
    const KilnSymbolDesc* y = &d->symbols[j];
    int ok = y->input >= 0 ? y->input < d->num_inputs && y->dim >= 0 &&
                                 y->dim < d->entries[d->inputs[y->input].entry].ndim
                           : y->input == -1 || (y->input == -2 && depth > 0 && d->api_version >= 4);
    if (!ok)
      return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: symbol '%s' is read from input %d, dim %d, which %s", y->name,
                  (int)y->input, (int)y->dim, y->input == -2 ? "only a nested graph (tables version 4) may name"
                                                               : "the model does not have");
  }
  return KILN_OK;
}

/* The data-dependent symbols' reports (KilnSymbolDesc.input -1), sorted by op: each read from the first
 * argument dim of its op that is the symbol (the first output the kernel reports it on, as
 * kiln.runtime.dynamic_shapes.data_dim_sources picks). The generator guarantees what is checked here;
 * the checks make a damaged table an error instead of a crash. */
static int32_t find_reports(KilnModel* m) {
  const KilnModelDesc* d = m->desc;
  int32_t n = 0, first = -1;
  for (int32_t j = 0; j < d->num_symbols; ++j)
    if (d->symbols[j].input == -1) {
      if (first < 0) first = j;
      ++n;
    }
  if (n == 0) return KILN_OK;
  if (d->api_version < 3)
    return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: symbol '%s' is data-dependent, which version-%d tables cannot "
                "hold (version 3)", d->symbols[first].name, (int)d->api_version);
  m->reports = calloc((size_t)n, sizeof(KilnReport));
  if (!m->reports) return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: out of memory");
  for (int32_t j = 0; j < d->num_symbols; ++j) {
    const KilnSymbolDesc* y = &d->symbols[j];
    if (y->input != -1) continue;
    /* a kernel reports its extents; a loop (version 4) its iteration count */
    if (y->dim < 0 || y->dim >= d->num_ops || d->ops[y->dim].flatten ||
        (d->ops[y->dim].kind != KILN_OP_CALL && (d->ops[y->dim].kind != KILN_OP_LOOP || d->api_version < 4)))
      return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: data-dependent symbol '%s' names op %d, not a kernel call (or "
                  "loop) of the model's %d ops", y->name, (int)y->dim, (int)d->num_ops);
    const KilnOpDesc* op = &d->ops[y->dim];
    KilnReport rep = {y->dim, j, -1, -1};
    for (int32_t a = 0; a < op->num_args && rep.entry < 0; ++a) {
      int32_t eid = d->op_args[op->first_arg + a];
      for (int32_t k = 0; k < d->entries[eid].ndim && rep.entry < 0; ++k)
        if (dim_expr(d, &d->entries[eid], k) == j) rep.entry = eid, rep.dim = k;
    }
    if (rep.entry < 0)
      return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: data-dependent symbol '%s': no argument of graph node '%s' has "
                  "it as a dim", y->name, op->name);
    int32_t at = m->num_reports++;
    for (; at > 0 && m->reports[at - 1].op > rep.op; --at) m->reports[at] = m->reports[at - 1];
    m->reports[at] = rep;
  }
  return KILN_OK;
}

/* ---------------- runtime control flow: create ---------------- */
static int one_element(const KilnModelDesc* d, int32_t eid, uint8_t code, uint8_t bits) {
  const KilnEntryDesc* e = &d->entries[eid];
  int64_t n = 1;
  for (int32_t k = 0; k < e->ndim; ++k) n *= d->shapes[e->shape_offset + k];
  return n == 1 && e->dtype.bits == bits && e->dtype.lanes == 1 && e->nbytes == bits / 8 &&
         (e->dtype.code == code || (bits == 8 && (e->dtype.code == kDLUInt || e->dtype.code == kDLInt)));
}

/* Whether entry a of da and entry b of db have the same planned storage: ndim, upper-bound dims,
 * item size and bytes (so a copy of the valid sub-box has one layout on both sides). `skip` leading
 * dims of b are left out (a scan output's rows). */
static int same_layout(const KilnModelDesc* da, int32_t a, const KilnModelDesc* db, int32_t b, int32_t skip) {
  const KilnEntryDesc *x = &da->entries[a], *y = &db->entries[b];
  if (x->ndim + skip != y->ndim || item_bytes(x->dtype) != item_bytes(y->dtype)) return 0;
  for (int32_t k = 0; k < x->ndim; ++k)
    if (da->shapes[x->shape_offset + k] != db->shapes[y->shape_offset + skip + k]) return 0;
  return skip || x->nbytes == y->nbytes;
}

/* An entry's actual shape: the instance's (dynamic) or the planned one. */
static const int64_t* actual_shape(const KilnModel* m, int32_t eid) {
  int32_t off = m->desc->entries[eid].shape_offset;
  return m->shapes ? m->shapes + off : m->desc->shapes + off;
}

/* Copy entry eid's valid data (its actual shape in m) from src to dst, both laid out as its storage. */
static void copy_entry(const KilnModel* m, int32_t eid, void* dst, const void* src) {
  const KilnModelDesc* d = m->desc;
  const KilnEntryDesc* e = &d->entries[eid];
  box_move(dst, src, actual_shape(m, eid), d->shapes + e->shape_offset, e->ndim, item_bytes(e->dtype), e->nbytes);
}

static int32_t bad_control(const KilnModelDesc* d, const KilnControlDesc* c, const char* why) {
  const char* name = c->op >= 0 && c->op < d->num_ops ? d->ops[c->op].name : "?";
  return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: control-flow op %d (graph node '%s'): %s", (int)c->op, name, why);
}

/* Create nested graph k of control row c and check what running it relies on: binds, the loop's
 * scalars, its outputs matching the op's outputs in size (the generator guarantees all of it; a
 * damaged table is an error, not a crash). */
static int32_t create_nested(KilnModel* m, KilnControl* ctl, int k, int depth) {
  const KilnModelDesc* d = m->desc;
  const KilnControlDesc* c = ctl->desc;
  const KilnOpDesc* op = &d->ops[c->op];
  const KilnNestedDesc* nd = &c->nested[k];
  const int32_t* outs = d->op_args + op->first_arg + c->num_inputs;
  int32_t n_out = op->num_args - c->num_inputs, loop = op->kind == KILN_OP_LOOP;
  KilnNested* n = &ctl->nested[k];
  n->desc = nd;
  if (!nd->graph || nd->num_binds < 0 || (nd->num_binds > 0 && !nd->binds) || !nd->key)
    return bad_control(d, c, "a nested graph's row is incomplete");
  int32_t s = create_model(nd->graph, NULL, &n->model, depth + 1);
  if (s != KILN_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", KilnGetLastError());
    return FAIL(s, "graph node '%s', function '%s', %s: %s", op->name, op->func_name, nd->key, msg);
  }
  const KilnModelDesc* sd = nd->graph;
  if (sd->num_params != 0) return bad_control(d, c, "a nested graph loads params (its params are bound)");
  if (sd->num_outputs != n_out + loop) return bad_control(d, c, "a nested graph's outputs do not match the op's");
  /* a symbol the enclosing graph gives (input -2) is one of its symbols, with the same range (the
   * same planned storage on both sides) */
  for (int32_t j = 0; j < sd->num_symbols; ++j) {
    const KilnSymbolDesc* y = &sd->symbols[j];
    if (y->input == -2 && (y->dim < 0 || y->dim >= d->num_symbols || d->symbols[y->dim].lo != y->lo ||
                           d->symbols[y->dim].hi != y->hi))
      return bad_control(d, c, "a nested graph's symbol is not one of the enclosing graph's, with its range");
  }
  /* every head and the loop's two scalar inputs are in range before anything reads them */
  for (int32_t h = 0; h < sd->num_outputs; ++h)
    if (sd->outputs[h].entry < 0 || sd->outputs[h].entry >= sd->num_entries)
      return bad_control(d, c, "a nested graph's output is out of range");
  if (loop && sd->num_inputs >= 2)
    for (int32_t k = 0; k < 2; ++k)
      if (sd->inputs[k].entry < 0 || sd->inputs[k].entry >= sd->num_entries)
        return bad_control(d, c, "the body's iteration number or condition is out of range");
  if (loop && (sd->num_inputs < 2 || !one_element(sd, sd->inputs[0].entry, kDLInt, 64) ||
               !one_element(sd, sd->inputs[1].entry, kDLBool, 8) || !one_element(sd, sd->outputs[0].entry, kDLBool, 8)))
    return bad_control(d, c, "the body's iteration number, condition or next condition is not a one-element scalar");
  for (int32_t b = 0; b < nd->num_binds; ++b) {
    int32_t se = nd->binds[2 * b], pe = nd->binds[2 * b + 1];
    if (se < 0 || se >= sd->num_entries || pe < 0 || pe >= d->num_entries)
      return bad_control(d, c, "a bind names an entry out of range");
    if (sd->entries[se].nbytes > d->entries[pe].nbytes)
      return bad_control(d, c, "a bind pairs a nested entry with a smaller one");
    if (loop && (se == sd->inputs[0].entry || se == sd->inputs[1].entry))
      return bad_control(d, c, "the body's iteration number or condition is bound");
  }
  /* the heads: sizes, and which ones are bound memory (snapshotted before writing back) */
  n->snap_at = malloc(sizeof(int64_t) * ((size_t)sd->num_outputs + 1));
  if (!n->snap_at) return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: out of memory");
  uint64_t scratch = 0;
  for (int32_t h = 0; h < sd->num_outputs; ++h) {
    int32_t he = sd->outputs[h].entry, j = h - loop; /* j: the op output this head goes to (-1: next condition) */
    if (he < 0 || he >= sd->num_entries) return bad_control(d, c, "a nested graph's output is out of range");
    uint64_t nb = sd->entries[he].nbytes;
    n->snap_at[h] = -1;
    if (j < 0) continue;
    int32_t oe = outs[j];
    if (j < n_out - c->num_scan) { /* a result / carried value: the whole op output */
      if (!same_layout(sd, he, d, oe, 0))
        return bad_control(d, c, "a nested graph's output and the op's output differ in planned shape");
    } else { /* one row of a scan output */
      if (!same_layout(sd, he, d, oe, 1) || ctl->bound < 0 || (nb && (uint64_t)ctl->bound > UINT64_MAX / nb) ||
          (uint64_t)ctl->bound * nb != d->entries[oe].nbytes)
        return bad_control(d, c, "a scan output is not (bound) rows of the body's output");
    }
    for (int32_t b = 0; b < nd->num_binds; ++b)
      if (nd->binds[2 * b] == he) {
        n->snap_at[h] = (int64_t)scratch;
        scratch += nb;
        break;
      }
  }
  n->scratch = malloc((size_t)scratch + 1);
  if (!n->scratch) return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: out of memory");
  return KILN_OK;
}

/* The control-flow ops of version-4 tables: rows checked against the ops and entries, nested
 * instances created. On failure the caller frees m (and with it what was created so far). */
static int32_t create_controls(KilnModel* m, int depth) {
  const KilnModelDesc* d = m->desc;
  if (d->num_controls < 0 || (d->num_controls > 0 && !d->controls))
    return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: %d control-flow rows", (int)d->num_controls);
  m->control_of = malloc(sizeof(int32_t) * ((size_t)d->num_ops + 1));
  m->controls = calloc((size_t)d->num_controls + 1, sizeof(KilnControl));
  if (!m->control_of || !m->controls) return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: out of memory");
  for (int32_t i = 0; i < d->num_ops; ++i) m->control_of[i] = -1;
  for (int32_t ci = 0; ci < d->num_controls; ++ci) {
    const KilnControlDesc* c = &d->controls[ci];
    KilnControl* ctl = &m->controls[ci];
    m->num_controls = ci + 1; /* freed from here on */
    ctl->desc = c;
    ctl->bound = -1;
    if (c->op < 0 || c->op >= d->num_ops || (d->ops[c->op].kind != KILN_OP_IF && d->ops[c->op].kind != KILN_OP_LOOP))
      return bad_control(d, c, "not an op of kind KILN_OP_IF or KILN_OP_LOOP");
    if (m->control_of[c->op] >= 0) return bad_control(d, c, "two rows for one op");
    m->control_of[c->op] = ci;
    const KilnOpDesc* op = &d->ops[c->op];
    int loop = op->kind == KILN_OP_LOOP;
    int32_t n_out = op->num_args - c->num_inputs;
    const int32_t* args = d->op_args + op->first_arg;
    if (c->num_inputs < 1 + loop || n_out < 0 || c->num_nested != 2 - loop || !c->nested)
      return bad_control(d, c, "its input, output or nested graph count does not fit the op");
    if (loop) {
      if (c->num_carried < 0 || c->num_scan < 0 || c->num_carried + c->num_scan != n_out ||
          c->num_inputs < 2 + c->num_carried)
        return bad_control(d, c, "num_carried and num_scan do not fit the op's inputs and outputs");
      if (!one_element(d, args[0], kDLInt, 64) || !one_element(d, args[1], kDLBool, 8))
        return bad_control(d, c, "the trip count or condition is not a one-element int64 / bool");
      for (int32_t k = 0; k < c->num_carried; ++k)
        if (!same_layout(d, args[2 + k], d, args[c->num_inputs + k], 0))
          return bad_control(d, c, "a carried value's initial entry and output differ in planned shape");
      /* the scan outputs: planned for `bound` rows, their leading dim the data-dependent symbol
       * this op reports (so the parent takes the count like a kernel-reported extent) */
      for (int32_t j = 0; j < c->num_scan; ++j) {
        const KilnEntryDesc* e = &d->entries[args[c->num_inputs + c->num_carried + j]];
        int32_t x = e->ndim >= 1 ? dim_expr(d, e, 0) : -1;
        if (!m->shapes || x < 0 || x >= d->num_symbols || d->symbols[x].input != -1 || d->symbols[x].dim != c->op)
          return bad_control(d, c, "a scan output's leading dim is not a data-dependent symbol the loop reports");
        int64_t b = d->shapes[e->shape_offset];
        if (b < 0 || (ctl->bound >= 0 && b != ctl->bound))
          return bad_control(d, c, "the scan outputs are planned for different iteration counts");
        ctl->bound = b;
      }
    } else {
      if (c->num_carried != 0 || c->num_scan != 0) return bad_control(d, c, "an If with carried or scan values");
      if (!one_element(d, args[0], kDLBool, 8)) return bad_control(d, c, "the condition is not a one-element bool");
    }
    for (int k = 0; k < c->num_nested; ++k) {
      int32_t s = create_nested(m, ctl, k, depth);
      if (s != KILN_OK) return s;
    }
  }
  for (int32_t i = 0; i < d->num_ops; ++i)
    if ((d->ops[i].kind == KILN_OP_IF || d->ops[i].kind == KILN_OP_LOOP) && m->control_of[i] < 0)
      return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: graph node '%s' is control flow without a control-flow row",
                  d->ops[i].name);
  return KILN_OK;
}

/* ---------------- create / free ---------------- */
KILN_DLL void KilnModelFree(KilnModel* m) {
  if (!m) return;
  if (m->storage)
    for (int32_t s = 0; s < m->desc->num_storage; ++s) free(m->storage[s]);
  free(m->storage);
  free(m->tensors);
  free(m->flat);
  free(m->flat_shape);
  free(m->values);
  free(m->codes);
  free(m->calls);
  free(m->input_set);
  free(m->shapes);
  free(m->strides);
  free(m->sym);
  free(m->applied);
  free(m->sym_from);
  free(m->dim_values);
  free(m->in_shapes);
  free(m->in_shape_at);
  free(m->reports);
  for (int32_t c = 0; m->controls && c < m->num_controls; ++c)
    for (int k = 0; k < 2; ++k) {
      KilnModelFree(m->controls[c].nested[k].model);
      free(m->controls[c].nested[k].snap_at);
      free(m->controls[c].nested[k].scratch);
    }
  free(m->controls);
  free(m->control_of);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

static int32_t bind_linked_params(KilnModel* m) {
  const KilnModelDesc* d = m->desc;
  for (int32_t p = 0; p < d->num_params; ++p) {
    KilnValue arg, ret;
    int32_t code = kKilnStr, ret_code = kKilnNullptr;
    arg.v_str = d->params[p].name;
    if (d->linked_param_lookup(&arg, &code, 1, &ret, &ret_code, NULL) != 0)
      return FAIL(KILN_ERR_FORMAT, "linked param '%s': the lookup failed: %s", d->params[p].name, KilnGetLastError());
    if (ret_code != kKilnOpaqueHandle || ret.v_handle == NULL)
      return FAIL(KILN_ERR_FORMAT, "linked param '%s' is not in the library", d->params[p].name);
    int32_t e = d->params[p].entry;
    m->tensors[e].data = ret.v_handle;
    m->flat[e].data = ret.v_handle;
  }
  return KILN_OK;
}

KILN_HIDDEN int32_t KilnModelCreateFromDesc(const KilnModelDesc* d, const char* params_path, KilnModel** out) {
  return create_model(d, params_path, out, 0);
}

/* Create an instance of tables `d`: the model (depth 0) or a nested graph of a control-flow op. */
static int32_t create_model(const KilnModelDesc* d, const char* params_path, KilnModel** out, int depth) {
  if (!out) return FAIL(KILN_ERR_ARGUMENT, "KilnModelCreate: out is NULL");
  *out = NULL;
  if (!d) return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: a nested graph has no tables");
  if (d->api_version < KILN_MODEL_TABLES_MIN_VERSION || d->api_version > KILN_MODEL_TABLES_VERSION)
    return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: the model tables are version %d, this code reads versions %d..%d",
                (int)d->api_version, KILN_MODEL_TABLES_MIN_VERSION, KILN_MODEL_TABLES_VERSION);
  if (d->unsupported) return FAIL(KILN_ERR_UNSUPPORTED, "KilnModelCreate: %s", d->unsupported);
  if (depth > KILN_MAX_NESTING)
    return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: control flow nested more than %d levels deep", KILN_MAX_NESTING);
  /* an op kind this code does not know (or control flow in tables older than version 4) would be
   * skipped or misrun: refuse it */
  for (int32_t i = 0; i < d->num_ops; ++i) {
    int32_t kind = d->ops[i].kind;
    if (kind != KILN_OP_CALL && kind != KILN_OP_COPY &&
        ((kind != KILN_OP_IF && kind != KILN_OP_LOOP) || d->api_version < 4))
      return FAIL(KILN_ERR_FORMAT, "KilnModelCreate: graph node '%s' has op kind %d, which version-%d tables cannot "
                  "hold", d->ops[i].name, (int)kind, (int)d->api_version);
  }
  KilnModel* m = calloc(1, sizeof(KilnModel));
  if (!m) return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: out of memory");
  m->desc = d;
  pthread_mutex_init(&m->mu, NULL);
  size_t ne = (size_t)d->num_entries, nargs = 0;
  for (int32_t i = 0; i < d->num_ops; ++i) nargs += (size_t)d->ops[i].num_args;
  m->storage = calloc((size_t)d->num_storage + 1, sizeof(void*));
  m->tensors = calloc(ne + 1, sizeof(DLTensor));
  m->flat = calloc(ne + 1, sizeof(DLTensor));
  m->flat_shape = calloc(ne + 1, sizeof(int64_t));
  m->values = calloc(nargs + 1, sizeof(KilnValue));
  m->codes = calloc(nargs + 1, sizeof(int32_t));
  m->calls = calloc((size_t)d->num_ops + 1, sizeof(KilnOpCall));
  m->input_set = calloc((size_t)d->num_inputs + 1, 1);
  if (!m->storage || !m->tensors || !m->flat || !m->flat_shape || !m->values || !m->codes || !m->calls ||
      !m->input_set) {
    KilnModelFree(m);
    return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: out of memory");
  }
  /* Zeroed, as the Python executor does: a buffer read before it is written holds 0, not old data. */
  for (int32_t s = 0; s < d->num_storage; ++s) {
    size_t size = (size_t)((d->storage_bytes[s] + 63) / 64 * 64);
    if (size == 0) size = 64;
    if (posix_memalign(&m->storage[s], 64, size) != 0) {
      m->storage[s] = NULL;
      KilnModelFree(m);
      return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: cannot allocate %zu bytes for storage slot %d", size, (int)s);
    }
    memset(m->storage[s], 0, size);
  }
  if (d->num_symbols > 0) {
    size_t nd = 0, nin = 0;
    for (size_t e = 0; e < ne; ++e)
      if ((size_t)d->entries[e].shape_offset + (size_t)d->entries[e].ndim > nd)
        nd = (size_t)d->entries[e].shape_offset + (size_t)d->entries[e].ndim;
    for (int32_t i = 0; i < d->num_inputs; ++i) nin += (size_t)d->entries[d->inputs[i].entry].ndim;
    m->shapes = malloc(sizeof(int64_t) * (nd + 1));
    m->strides = calloc(nd + 1, sizeof(int64_t));
    m->sym = calloc((size_t)d->num_symbols, sizeof(int64_t));
    m->applied = calloc((size_t)d->num_symbols, sizeof(int64_t));
    m->sym_from = calloc((size_t)d->num_symbols, sizeof(int32_t));
    m->dim_values = calloc((size_t)d->num_dim_exprs + 1, sizeof(int64_t));
    m->in_shapes = calloc(nin + 1, sizeof(int64_t));
    m->in_shape_at = calloc((size_t)d->num_inputs + 1, sizeof(int32_t));
    if (!m->shapes || !m->strides || !m->sym || !m->applied || !m->sym_from || !m->dim_values || !m->in_shapes ||
        !m->in_shape_at) {
      KilnModelFree(m);
      return FAIL(KILN_ERR_MEMORY, "KilnModelCreate: out of memory");
    }
    memcpy(m->shapes, d->shapes, sizeof(int64_t) * nd);
    nin = 0;
    for (int32_t i = 0; i < d->num_inputs; ++i) {
      const KilnEntryDesc* e = &d->entries[d->inputs[i].entry];
      m->in_shape_at[i] = (int32_t)nin;
      memcpy(m->in_shapes + nin, d->shapes + e->shape_offset, sizeof(int64_t) * (size_t)e->ndim);
      nin += (size_t)e->ndim;
    }
  }
  for (size_t e = 0; e < ne; ++e) {
    const KilnEntryDesc* ed = &d->entries[e];
    DLTensor* t = &m->tensors[e];
    t->data = (char*)m->storage[ed->storage] + ed->byte_offset;
    t->device.device_type = kDLCPU;
    t->ndim = ed->ndim;
    t->dtype = ed->dtype;
    /* the kernels never write shapes; a dynamic graph's are the instance's own, rewritten per shape */
    t->shape = m->shapes ? m->shapes + ed->shape_offset : (int64_t*)(d->shapes + ed->shape_offset);
    int64_t size = 1;
    for (int32_t k = 0; k < ed->ndim; ++k) size *= d->shapes[ed->shape_offset + k];
    m->flat_shape[e] = size; /* the padded box's element count, whatever the actual shape */
    m->flat[e] = *t;
    m->flat[e].ndim = 1;
    m->flat[e].shape = &m->flat_shape[e];
    if (m->shapes && entry_dynamic(d, ed)) { /* the padded layout's strides, as the Python executor sets */
      int64_t stride = 1;
      for (int32_t k = ed->ndim - 1; k >= 0; --k) {
        m->strides[ed->shape_offset + k] = stride;
        stride *= d->shapes[ed->shape_offset + k];
      }
      t->strides = m->strides + ed->shape_offset;
    }
  }
  if (d->num_symbols > 0) { /* the shapes at every symbol's upper bound, as the Python executor starts */
    for (int32_t j = 0; j < d->num_symbols; ++j) {
      m->sym[j] = d->symbols[j].hi;
      m->applied[j] = d->symbols[j].hi + 1; /* differs: the first update writes every shape */
      m->sym_from[j] = d->symbols[j].input;
    }
    int32_t st = check_symbols(d, depth);
    if (st == KILN_OK) st = check_dim_exprs(d);
    if (st == KILN_OK) st = find_reports(m);
    if (st == KILN_OK) st = update_shapes(m, "KilnModelCreate", 0, INT32_MAX);
    if (st != KILN_OK) {
      KilnModelFree(m);
      return st;
    }
  }
  size_t arg = 0;
  for (int32_t i = 0; i < d->num_ops; ++i) {
    const KilnOpDesc* op = &d->ops[i];
    for (int32_t k = 0; k < op->num_args; ++k) {
      int32_t e = d->op_args[op->first_arg + k];
      m->values[arg + (size_t)k].v_handle = op->flatten ? &m->flat[e] : &m->tensors[e];
      m->codes[arg + (size_t)k] = kKilnDLTensorHandle;
    }
    m->calls[i].fn = op->fn;
    m->calls[i].args = &m->values[arg];
    m->calls[i].type_codes = &m->codes[arg];
    m->calls[i].num_args = op->num_args;
    arg += (size_t)op->num_args;
  }
  int32_t status = d->api_version >= 4 ? create_controls(m, depth) : KILN_OK;
  if (status != KILN_OK) {
    KilnModelFree(m);
    return status;
  }
  if (d->num_params > 0) {
    if (params_path) {
      uint8_t* data = NULL;
      uint64_t n = 0;
      status = read_file(params_path, &data, &n);
      if (status == KILN_OK) {
        char what[600];
        snprintf(what, sizeof what, "params file '%s'", params_path);
        Cursor c = {data, n, 0, what, 0};
        status = load_params(m, &c);
        free(data);
      }
    } else if (d->linked_param_lookup) {
      status = bind_linked_params(m);
    } else if (d->blob) {
      Cursor c;
      status = blob_params(d, &c);
      if (status == KILN_OK) status = load_params(m, &c);
    } else {
      status = FAIL(KILN_ERR_ARGUMENT, "KilnModelCreate: model '%s' has %d params but the library carries none; "
                    "pass a params file", d->mod_name, (int)d->num_params);
    }
  }
  if (status != KILN_OK) {
    KilnModelFree(m);
    return status;
  }
  *out = m;
  return KILN_OK;
}

/* ---------------- CPU feature levels (kiln.build_portable) ---------------- */
/* Whether every space-separated flag of `need` is a whole word of `have`. */
static int has_flags(const char* have, const char* need) {
  const char* p = need;
  while (*p) {
    while (*p == ' ') ++p;
    size_t n = strcspn(p, " ");
    if (n == 0) break;
    int found = 0;
    for (const char* h = have; *h && !found;) {
      while (*h == ' ' || *h == '\t' || *h == '\n') ++h;
      size_t m = strcspn(h, " \t\n");
      if (m == 0) break; /* end of the line */
      found = m == n && memcmp(h, p, n) == 0;
      h += m;
    }
    if (!found) return 0;
    p += n;
  }
  return 1;
}

/* The x86 "flags" / Arm "Features" line of /proc/cpuinfo (as the Python loader reads it), or NULL. */
static char* cpu_flags_line(void) {
  FILE* f = fopen("/proc/cpuinfo", "r");
  if (!f) return NULL;
  char* line = NULL;
  size_t cap = 0;
  char* out = NULL;
  while (getline(&line, &cap, f) > 0) {
    if (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0) {
      char* colon = strchr(line, ':');
      if (colon) out = strdup(colon + 1);
      break;
    }
  }
  free(line);
  fclose(f);
  return out;
}

KILN_HIDDEN int32_t KilnModelSelectVariant(const KilnModelVariant* v, int32_t n) {
  char* flags = cpu_flags_line();
  const char* forced = getenv("KILN_ISA_VARIANT");
  int32_t pick = -1;
  if (forced && *forced) {
    for (int32_t i = 0; i < n; ++i)
      if (strcmp(v[i].mod_name, forced) == 0) pick = i;
    if (pick < 0) KilnErrorf("KILN_ISA_VARIANT=%s names no variant of this library", forced);
    else if (flags && !has_flags(flags, v[pick].cpu_flags)) {
      KilnErrorf("KILN_ISA_VARIANT=%s: this CPU lacks some of %s", forced, v[pick].cpu_flags);
      pick = -1;
    }
  } else if (!flags) {
    pick = n - 1;
  } else {
    for (int32_t i = 0; i < n && pick < 0; ++i)
      if (has_flags(flags, v[i].cpu_flags)) pick = i;
    if (pick < 0) KilnErrorf("no variant of this library runs on this CPU (the least demanding needs %s)",
                             v[n - 1].cpu_flags);
  }
  free(flags);
  return pick;
}

/* ---------------- queries ---------------- */
KILN_DLL int32_t KilnModelNumInputs(const KilnModel* m) { return m ? m->desc->num_inputs : -1; }
KILN_DLL int32_t KilnModelNumOutputs(const KilnModel* m) { return m ? m->desc->num_outputs : -1; }

KILN_DLL int32_t KilnModelInputIndex(const KilnModel* m, const char* name) {
  if (!m || !name) {
    KilnErrorf("KilnModelInputIndex: %s is NULL", m ? "name" : "model");
    return -1;
  }
  const KilnModelDesc* d = m->desc;
  for (int32_t i = 0; i < d->num_inputs; ++i)
    if (strcmp(d->inputs[i].name, name) == 0) return i;
  char names[400];
  size_t k = 0;
  names[0] = 0;
  for (int32_t i = 0; i < d->num_inputs && k < sizeof names; ++i)
    k += (size_t)snprintf(names + k, sizeof names - k, i ? ", '%s'" : "'%s'", d->inputs[i].name);
  KilnErrorf("model '%s' has no input '%s'; its inputs: %s", d->mod_name, name, d->num_inputs ? names : "none");
  return -1;
}

static int32_t check_index(const KilnModel* m, int32_t index, int32_t count, const char* fn, const char* what) {
  if (!m) return FAIL(KILN_ERR_ARGUMENT, "%s: model is NULL", fn);
  if (index < 0 || index >= count)
    return FAIL(KILN_ERR_ARGUMENT, "%s: %s index %d is out of range (the model has %d)", fn, what, (int)index,
                (int)count);
  return KILN_OK;
}

static int32_t get_info(const KilnModel* m, int32_t index, int output, KilnTensorInfo* info) {
  const char* fn = output ? "KilnModelGetOutputInfo" : "KilnModelGetInputInfo";
  int32_t count = m ? (output ? m->desc->num_outputs : m->desc->num_inputs) : 0;
  int32_t s = check_index(m, index, count, fn, output ? "output" : "input");
  if (s != KILN_OK) return s;
  if (!info) return FAIL(KILN_ERR_ARGUMENT, "%s: info is NULL", fn);
  const KilnNamedEntry* ne = output ? &m->desc->outputs[index] : &m->desc->inputs[index];
  const KilnEntryDesc* e = &m->desc->entries[ne->entry];
  info->name = ne->name;
  info->ndim = e->ndim;
  info->shape = m->desc->shapes + e->shape_offset;
  info->dtype = e->dtype;
  info->nbytes = e->nbytes;
  return KILN_OK;
}

KILN_DLL int32_t KilnModelGetInputInfo(const KilnModel* m, int32_t index, KilnTensorInfo* info) {
  return get_info(m, index, 0, info);
}

KILN_DLL int32_t KilnModelGetOutputInfo(const KilnModel* m, int32_t index, KilnTensorInfo* info) {
  return get_info(m, index, 1, info);
}

KILN_DLL int32_t KilnModelNumSymbols(const KilnModel* m) { return m ? m->desc->num_symbols : -1; }

KILN_DLL int32_t KilnModelGetSymbolInfo(const KilnModel* m, int32_t index, KilnSymbolInfo* info) {
  int32_t s = check_index(m, index, m ? m->desc->num_symbols : 0, "KilnModelGetSymbolInfo", "symbol");
  if (s != KILN_OK) return s;
  if (!info) return FAIL(KILN_ERR_ARGUMENT, "KilnModelGetSymbolInfo: info is NULL");
  const KilnSymbolDesc* y = &m->desc->symbols[index];
  info->name = y->name;
  info->lo = y->lo;
  info->hi = y->hi;
  return KILN_OK;
}

static int32_t get_dims(const KilnModel* m, int32_t index, int output, const char** dims, int32_t capacity) {
  const char* fn = output ? "KilnModelGetOutputDims" : "KilnModelGetInputDims";
  int32_t count = m ? (output ? m->desc->num_outputs : m->desc->num_inputs) : 0;
  int32_t s = check_index(m, index, count, fn, output ? "output" : "input");
  if (s != KILN_OK) return s;
  const KilnNamedEntry* ne = output ? &m->desc->outputs[index] : &m->desc->inputs[index];
  const KilnEntryDesc* e = &m->desc->entries[ne->entry];
  if (!dims && e->ndim) return FAIL(KILN_ERR_ARGUMENT, "%s: dims is NULL", fn);
  if (capacity < e->ndim)
    return FAIL(KILN_ERR_ARGUMENT, "%s: '%s' has %d dims, room was given for %d", fn, ne->name, (int)e->ndim,
                (int)capacity);
  for (int32_t k = 0; k < e->ndim; ++k) {
    int32_t x = dim_expr(m->desc, e, k);
    dims[k] = x >= 0 ? m->desc->dim_exprs[x].text : NULL;
  }
  return KILN_OK;
}

KILN_DLL int32_t KilnModelGetInputDims(const KilnModel* m, int32_t index, const char** dims, int32_t capacity) {
  return get_dims(m, index, 0, dims, capacity);
}

KILN_DLL int32_t KilnModelGetOutputDims(const KilnModel* m, int32_t index, const char** dims, int32_t capacity) {
  return get_dims(m, index, 1, dims, capacity);
}

/* ---------------- inputs / run / outputs ---------------- */
/* Check `shape` against input `index`'s dims (static dims equal, symbols in range and one value per
 * symbol), copy compact data of that shape into the input's (padded) storage and take the symbols'
 * values from it. Inputs that disagree with each other are found by the next run. */
static int32_t set_shaped(KilnModel* m, int32_t index, const int64_t* shape, int32_t ndim, const void* data,
                          uint64_t nbytes, const char* fn) {
  int32_t s = check_index(m, index, m ? m->desc->num_inputs : 0, fn, "input");
  if (s != KILN_OK) return s;
  const KilnModelDesc* d = m->desc;
  const KilnNamedEntry* in = &d->inputs[index];
  const KilnEntryDesc* e = &d->entries[in->entry];
  const int64_t* up = d->shapes + e->shape_offset;
  char a[160], b[160], c1[32];
  if (!shape && ndim > 0) return FAIL(KILN_ERR_ARGUMENT, "%s: shape for input '%s' is NULL", fn, in->name);
  if (ndim != e->ndim)
    return FAIL(KILN_ERR_SHAPE, "%s: input '%s': shape %s has %d dims, expected %d %s", fn, in->name,
                ndim >= 0 ? KilnShapeText(ndim, shape, a, sizeof a) : "()", (int)ndim, (int)e->ndim,
                dims_text(d, e, b, sizeof b));
  uint64_t count = 1;
  for (int32_t k = 0; k < ndim; ++k) {
    int32_t x = dim_expr(d, e, k);
    if (x < 0) {
      if (shape[k] != up[k])
        return FAIL(KILN_ERR_SHAPE, "%s: input '%s': dim %d is %lld, expected %lld (shape %s)", fn, in->name, (int)k,
                    (long long)shape[k], (long long)up[k], dims_text(d, e, b, sizeof b));
    } else if (x < d->num_symbols) {
      const KilnSymbolDesc* y = &d->symbols[x];
      if (shape[k] < y->lo || shape[k] > y->hi)
        return FAIL(KILN_ERR_SHAPE, "%s: input '%s': dim %d (%s) is %lld, outside its range %lld..%lld", fn, in->name,
                    (int)k, y->name, (long long)shape[k], (long long)y->lo, (long long)y->hi);
      for (int32_t q = 0; q < k; ++q)
        if (dim_expr(d, e, q) == x && shape[q] != shape[k])
          return FAIL(KILN_ERR_SHAPE, "%s: input '%s': dimension '%s' is both %lld and %lld in shape %s", fn,
                      in->name, y->name, (long long)shape[q], (long long)shape[k],
                      KilnShapeText(ndim, shape, a, sizeof a));
    } else if (shape[k] < 0 || shape[k] > up[k]) {
      /* an expression of symbols other dims give: checked exactly at the run, bounded here */
      return FAIL(KILN_ERR_SHAPE, "%s: input '%s': dim %d (%s) is %lld, outside 0..%lld (the most its symbols' "
                  "ranges give)", fn, in->name, (int)k, d->dim_exprs[x].text, (long long)shape[k], (long long)up[k]);
    }
    count *= (uint64_t)shape[k];
  }
  uint64_t want = count * item_bytes(e->dtype);
  if (nbytes != want)
    return FAIL(KILN_ERR_SHAPE, "%s: input '%s' of shape %s is %s = %llu bytes, got %llu bytes", fn, in->name,
                KilnShapeText(ndim, shape, a, sizeof a), dtype_text(e->dtype, c1, sizeof c1), (unsigned long long)want,
                (unsigned long long)nbytes);
  if (!data && want) return FAIL(KILN_ERR_ARGUMENT, "%s: data for input '%s' is NULL", fn, in->name);
  pthread_mutex_lock(&m->mu);
  if (want) box_copy(m->tensors[in->entry].data, (char*)data, shape, up, ndim, item_bytes(e->dtype), 1);
  if (m->shapes) {
    if (ndim) memcpy(m->in_shapes + m->in_shape_at[index], shape, sizeof(int64_t) * (size_t)ndim);
    for (int32_t k = 0; k < ndim; ++k) {
      int32_t x = dim_expr(d, e, k);
      if (x >= 0 && x < d->num_symbols) {
        m->sym[x] = shape[k];
        m->sym_from[x] = index;
      }
    }
    m->dirty = 1;
  }
  m->input_set[index] = 1;
  pthread_mutex_unlock(&m->mu);
  return KILN_OK;
}

KILN_DLL int32_t KilnModelSetInputShaped(KilnModel* m, int32_t index, const int64_t* shape, int32_t ndim,
                                         const void* data, uint64_t nbytes) {
  return set_shaped(m, index, shape, ndim, data, nbytes, "KilnModelSetInputShaped");
}

KILN_DLL int32_t KilnModelSetInput(KilnModel* m, int32_t index, const void* data, uint64_t nbytes) {
  int32_t s = check_index(m, index, m ? m->desc->num_inputs : 0, "KilnModelSetInput", "input");
  if (s != KILN_OK) return s;
  const KilnNamedEntry* in = &m->desc->inputs[index];
  const KilnEntryDesc* e = &m->desc->entries[in->entry];
  if (!data && e->nbytes) return FAIL(KILN_ERR_ARGUMENT, "KilnModelSetInput: data for input '%s' is NULL", in->name);
  if (nbytes != e->nbytes) {
    char a[160], b[32], c[160];
    if (entry_dynamic(m->desc, e))
      return FAIL(KILN_ERR_SHAPE, "KilnModelSetInput: input '%s' is %s %s, which KilnModelSetInput sets at its upper "
                  "bounds %s = %llu bytes, got %llu bytes (KilnModelSetInputShaped sets any shape in range)", in->name,
                  dtype_text(e->dtype, b, sizeof b), dims_text(m->desc, e, c, sizeof c),
                  KilnShapeText(e->ndim, m->desc->shapes + e->shape_offset, a, sizeof a),
                  (unsigned long long)e->nbytes, (unsigned long long)nbytes);
    return FAIL(KILN_ERR_SHAPE, "KilnModelSetInput: input '%s' is %s %s = %llu bytes, got %llu bytes", in->name,
                dtype_text(e->dtype, b, sizeof b), KilnShapeText(e->ndim, m->desc->shapes + e->shape_offset, a, sizeof a),
                (unsigned long long)e->nbytes, (unsigned long long)nbytes);
  }
  if (m->shapes) /* a dynamic graph: its symbols' values come from the (upper-bound) shape */
    return set_shaped(m, index, m->desc->shapes + e->shape_offset, e->ndim, data, nbytes, "KilnModelSetInput");
  pthread_mutex_lock(&m->mu);
  if (nbytes) memcpy(m->tensors[in->entry].data, data, (size_t)nbytes);
  m->input_set[index] = 1;
  pthread_mutex_unlock(&m->mu);
  return KILN_OK;
}

KILN_DLL int32_t KilnModelSetInputByName(KilnModel* m, const char* name, const void* data, uint64_t nbytes) {
  int32_t i = KilnModelInputIndex(m, name);
  if (i < 0) return KILN_ERR_ARGUMENT;
  return KilnModelSetInput(m, i, data, nbytes);
}

KILN_DLL int32_t KilnModelSetInputTensor(KilnModel* m, int32_t index, const DLTensor* t) {
  int32_t s = check_index(m, index, m ? m->desc->num_inputs : 0, "KilnModelSetInputTensor", "input");
  if (s != KILN_OK) return s;
  const KilnNamedEntry* in = &m->desc->inputs[index];
  const KilnEntryDesc* e = &m->desc->entries[in->entry];
  const int64_t* want = m->desc->shapes + e->shape_offset;
  char a[160], b[160], c1[32], c2[32];
  if (!t) return FAIL(KILN_ERR_ARGUMENT, "KilnModelSetInputTensor: tensor for input '%s' is NULL", in->name);
  if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
    return FAIL(KILN_ERR_ARGUMENT, "KilnModelSetInputTensor: input '%s' must be a CPU tensor, got device type %d",
                in->name, (int)t->device.device_type);
  if (t->dtype.code != e->dtype.code || t->dtype.bits != e->dtype.bits || t->dtype.lanes != 1)
    return FAIL(KILN_ERR_DTYPE, "KilnModelSetInputTensor: input '%s' expects dtype %s, got %s", in->name,
                dtype_text(e->dtype, c1, sizeof c1), dtype_text(t->dtype, c2, sizeof c2));
  int dynamic = entry_dynamic(m->desc, e);
  if (dynamic) {
    if (t->ndim > 0 && !t->shape)
      return FAIL(KILN_ERR_SHAPE, "KilnModelSetInputTensor: input '%s' expects shape %s, got (NULL shape)", in->name,
                  dims_text(m->desc, e, a, sizeof a));
    want = t->shape; /* checked against the dims by set_shaped */
  } else {
    int same = t->ndim == e->ndim && (t->ndim == 0 || t->shape != NULL);
    for (int32_t k = 0; same && k < e->ndim; ++k) same = t->shape[k] == want[k];
    if (!same)
      return FAIL(KILN_ERR_SHAPE, "KilnModelSetInputTensor: input '%s' expects shape %s, got %s", in->name,
                  KilnShapeText(e->ndim, want, a, sizeof a),
                  t->shape || t->ndim == 0 ? KilnShapeText(t->ndim, t->shape, b, sizeof b) : "(NULL shape)");
  }
  uint64_t count = 1;
  if (t->strides && t->ndim == e->ndim) {
    int64_t expect = 1;
    for (int32_t k = e->ndim - 1; k >= 0; --k) {
      if (want[k] != 1 && t->strides[k] != expect)
        return FAIL(KILN_ERR_ARGUMENT, "KilnModelSetInputTensor: input '%s' must be compact row-major (stride of "
                    "dim %d is %lld, expected %lld)", in->name, (int)k, (long long)t->strides[k], (long long)expect);
      expect *= want[k];
    }
  }
  const char* data = (const char*)t->data + t->byte_offset;
  if (!dynamic) return KilnModelSetInput(m, index, data, e->nbytes);
  for (int32_t k = 0; k < t->ndim && k < e->ndim; ++k) count *= (uint64_t)(t->shape[k] > 0 ? t->shape[k] : 0);
  return set_shaped(m, index, t->shape, t->ndim, data, count * item_bytes(e->dtype), "KilnModelSetInputTensor");
}

/* ---------------- runtime control flow: run ---------------- */
/* Point every bound entry of nested graph n at its parent entry's memory (which may itself be
 * bound, in a graph nested deeper): zero copy, as kiln.runtime.control_flow binds them. */
static void bind_nested(KilnModel* m, KilnNested* n) {
  for (int32_t b = 0; b < n->desc->num_binds; ++b) {
    int32_t se = n->desc->binds[2 * b], pe = n->desc->binds[2 * b + 1];
    n->model->tensors[se].data = m->tensors[pe].data;
    n->model->flat[se].data = m->tensors[pe].data;
  }
}

/* Before running nested graph n: its symbols take the enclosing graph's current values (its
 * entries re-shaped only when one changed), its arguments are bound. Then run it. */
static int32_t run_nested(KilnModel* m, const KilnOpDesc* op, KilnNested* n) {
  KilnModel* sub = n->model;
  int32_t s = KILN_OK;
  if (sub->shapes) {
    const KilnModelDesc* sd = sub->desc;
    for (int32_t j = 0; j < sd->num_symbols; ++j)
      if (sd->symbols[j].input == -2) sub->sym[j] = m->sym[sd->symbols[j].dim];
    s = apply_symbols(sub, "KilnModelRun", 0, -1);
  }
  bind_nested(m, n);
  if (s == KILN_OK) s = run_ops(sub);
  if (s != KILN_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", KilnGetLastError());
    return FAIL(s, "graph node '%s', function '%s', %s: %s", op->name, op->func_name, n->desc->key, msg);
  }
  return KILN_OK;
}

/* Copy nested outputs [h0, h1) into the op outputs outs[h - skip]: first snapshot every one that is
 * bound memory (a body returning its carried arguments swapped reads the old values), then write. */
static void write_back(KilnNested* n, KilnModel* m, const int32_t* outs, int32_t h0, int32_t h1, int32_t skip) {
  const KilnModelDesc* sd = n->model->desc;
  for (int32_t h = h0; h < h1; ++h)
    if (n->snap_at[h] >= 0)
      copy_entry(n->model, sd->outputs[h].entry, n->scratch + n->snap_at[h], n->model->tensors[sd->outputs[h].entry].data);
  for (int32_t h = h0; h < h1; ++h) {
    int32_t he = sd->outputs[h].entry;
    const void* src = n->snap_at[h] >= 0 ? n->scratch + n->snap_at[h] : n->model->tensors[he].data;
    copy_entry(n->model, he, m->tensors[outs[h - skip]].data, src); /* same layout and shape on both sides */
  }
}

static int truthy(const void* p) { return *(const uint8_t*)p != 0; }

/* Run control-flow op i (lock held). A loop writes its iteration count into the leading dim of its
 * scan outputs; the caller takes it as the op's report. */
static int32_t run_control(KilnModel* m, int32_t i) {
  const KilnModelDesc* d = m->desc;
  const KilnOpDesc* op = &d->ops[i];
  KilnControl* ctl = &m->controls[m->control_of[i]];
  const KilnControlDesc* c = ctl->desc;
  const int32_t* args = d->op_args + op->first_arg;
  const int32_t* outs = args + c->num_inputs;
  if (op->kind == KILN_OP_IF) {
    KilnNested* n = &ctl->nested[truthy(m->tensors[args[0]].data) ? 0 : 1];
    int32_t s = run_nested(m, op, n);
    if (s == KILN_OK) write_back(n, m, outs, 0, n->model->desc->num_outputs, 0);
    return s;
  }
  KilnNested* n = &ctl->nested[0];
  KilnModel* b = n->model;
  const KilnModelDesc* bd = b->desc;
  int64_t trip;
  memcpy(&trip, m->tensors[args[0]].data, sizeof trip);
  int cond = truthy(m->tensors[args[1]].data);
  /* the carried values live in the op's outputs; the body's carried arguments are bound to them */
  for (int32_t k = 0; k < c->num_carried; ++k)
    copy_entry(m, outs[k], m->tensors[outs[k]].data, m->tensors[args[2 + k]].data);
  int64_t it = 0;
  void* it_data = b->tensors[bd->inputs[0].entry].data;
  uint8_t* cond_data = b->tensors[bd->inputs[1].entry].data;
  for (; cond && it < trip; ++it) {
    if (c->num_scan > 0 && it >= ctl->bound)
      return FAIL(KILN_ERR_SHAPE, "KilnModelRun: graph node '%s', function '%s': the loop runs more than %lld "
                  "iterations, the bound its scan outputs were planned for (the trip count M known at import, else "
                  "kiln.frontend.onnx.ops_control.RUNTIME_LOOP_MAX_ITERATIONS)", op->name, op->func_name,
                  (long long)ctl->bound);
    memcpy(it_data, &it, sizeof it);
    *cond_data = 1;
    int32_t s = run_nested(m, op, n);
    if (s != KILN_OK) return s;
    /* read after the run: the next condition may be bound memory, whose pointer the bind inside
     * run_nested sets (a constant true hoisted into a param, a carried bool) */
    cond = truthy(b->tensors[bd->outputs[0].entry].data);
    /* scan rows first: they read the heads before any carried value (which a head may be bound
     * to) is overwritten; the scan outputs themselves are bound to nothing in the body */
    for (int32_t j = 0; j < c->num_scan; ++j) { /* a row is laid out as the head (same planned dims) */
      int32_t he = bd->outputs[1 + c->num_carried + j].entry;
      copy_entry(b, he, (char*)m->tensors[outs[c->num_carried + j]].data + (size_t)it * (size_t)bd->entries[he].nbytes,
                 b->tensors[he].data);
    }
    write_back(n, m, outs, 1, 1 + c->num_carried, 1);
  }
  for (int32_t j = 0; j < c->num_scan; ++j) {
    const KilnEntryDesc* e = &d->entries[outs[c->num_carried + j]];
    m->shapes[e->shape_offset] = it; /* read back as the op's report (take_reports) */
  }
  return KILN_OK;
}

/* ---------------- run ---------------- */
/* One run of m's op sequence (lock held; a nested instance runs under its parent's lock). */
static int32_t run_ops(KilnModel* m) {
  const KilnModelDesc* d = m->desc;
  int32_t status = KILN_OK;
  if (m->shapes && m->dirty) status = update_shapes(m, "KilnModelRun", 1, -1);
  int32_t i = 0, r = 0;
  while (i < d->num_ops && status == KILN_OK) {
    const KilnOpDesc* op = &d->ops[i];
    if (op->kind == KILN_OP_COPY) {
      int32_t src = d->op_args[op->first_arg], dst = d->op_args[op->first_arg + 1];
      memmove(m->tensors[dst].data, m->tensors[src].data, (size_t)d->entries[dst].nbytes);
      ++i;
      continue;
    }
    if (op->kind != KILN_OP_CALL) { /* control flow: run on its own, then take what it reports */
      status = run_control(m, i);
      if (status == KILN_OK && r < m->num_reports && m->reports[r].op == i) {
        int32_t r1 = r;
        while (r1 < m->num_reports && m->reports[r1].op == i) ++r1;
        status = take_reports(m, r, r1);
        r = r1;
      }
      ++i;
      continue;
    }
    /* the next kernel reporting a data-dependent dim ends the run of calls: the kernels after it
     * read the extent it decides */
    int32_t end = r < m->num_reports ? m->reports[r].op + 1 : d->num_ops;
    int32_t j = i;
    while (j < end && d->ops[j].kind == KILN_OP_CALL) ++j;
    int32_t failed = KilnRunSequence(&m->calls[i], j - i);
    if (failed != -1) {
      const KilnOpDesc* bad = &d->ops[i + failed];
      char msg[512];
      snprintf(msg, sizeof msg, "%s", KilnGetLastError());
      status = FAIL(KILN_ERR_KERNEL, "graph node '%s', function '%s' failed: %s", bad->name, bad->func_name,
                    msg[0] ? msg : "no error message recorded");
      if (r < m->num_reports && m->reports[r].op == i + failed) restore_reported(m, i + failed);
    } else if (j == end && r < m->num_reports) {
      int32_t r1 = r;
      while (r1 < m->num_reports && m->reports[r1].op == m->reports[r].op) ++r1;
      status = take_reports(m, r, r1);
      r = r1;
    }
    i = j;
  }
  return status;
}

KILN_DLL int32_t KilnModelRun(KilnModel* m) {
  if (!m) return FAIL(KILN_ERR_ARGUMENT, "KilnModelRun: model is NULL");
  const KilnModelDesc* d = m->desc;
  for (int32_t i = 0; i < d->num_inputs; ++i)
    if (!m->input_set[i])
      return FAIL(KILN_ERR_STATE, "KilnModelRun: input '%s' was never set (KilnModelSetInput)", d->inputs[i].name);
  pthread_mutex_lock(&m->mu);
  int32_t status = run_ops(m);
  pthread_mutex_unlock(&m->mu);
  return status;
}

/* Output `index`'s actual shape and compact byte size (lock held). */
static const int64_t* output_shape(const KilnModel* m, int32_t index, uint64_t* nbytes) {
  const KilnEntryDesc* e = &m->desc->entries[m->desc->outputs[index].entry];
  const int64_t* shape = m->shapes ? m->shapes + e->shape_offset : m->desc->shapes + e->shape_offset;
  uint64_t count = 1;
  for (int32_t k = 0; k < e->ndim; ++k) count *= (uint64_t)shape[k];
  *nbytes = m->shapes ? count * item_bytes(e->dtype) : e->nbytes;
  return shape;
}

KILN_DLL int32_t KilnModelGetOutputShape(KilnModel* m, int32_t index, int64_t* shape, int32_t capacity,
                                         uint64_t* nbytes) {
  int32_t s = check_index(m, index, m ? m->desc->num_outputs : 0, "KilnModelGetOutputShape", "output");
  if (s != KILN_OK) return s;
  const KilnEntryDesc* e = &m->desc->entries[m->desc->outputs[index].entry];
  if (!shape && e->ndim) return FAIL(KILN_ERR_ARGUMENT, "KilnModelGetOutputShape: shape is NULL");
  if (capacity < e->ndim)
    return FAIL(KILN_ERR_ARGUMENT, "KilnModelGetOutputShape: output %d has %d dims, room was given for %d", (int)index,
                (int)e->ndim, (int)capacity);
  uint64_t n;
  pthread_mutex_lock(&m->mu);
  const int64_t* actual = output_shape(m, index, &n);
  if (e->ndim) memcpy(shape, actual, sizeof(int64_t) * (size_t)e->ndim);
  pthread_mutex_unlock(&m->mu);
  if (nbytes) *nbytes = n;
  return KILN_OK;
}

KILN_DLL int32_t KilnModelGetOutput(KilnModel* m, int32_t index, void* data, uint64_t nbytes) {
  int32_t s = check_index(m, index, m ? m->desc->num_outputs : 0, "KilnModelGetOutput", "output");
  if (s != KILN_OK) return s;
  const KilnNamedEntry* o = &m->desc->outputs[index];
  const KilnEntryDesc* e = &m->desc->entries[o->entry];
  uint64_t need;
  pthread_mutex_lock(&m->mu);
  const int64_t* shape = output_shape(m, index, &need);
  if (nbytes < need) {
    char a[160];
    if (m->shapes) s = FAIL(KILN_ERR_ARGUMENT, "KilnModelGetOutput: output %d of shape %s needs %llu bytes, the buffer "
                            "has %llu", (int)index, KilnShapeText(e->ndim, shape, a, sizeof a),
                            (unsigned long long)need, (unsigned long long)nbytes);
    else s = FAIL(KILN_ERR_ARGUMENT, "KilnModelGetOutput: output %d needs %llu bytes, the buffer has %llu", (int)index,
                  (unsigned long long)need, (unsigned long long)nbytes);
  } else if (!data && need) {
    s = FAIL(KILN_ERR_ARGUMENT, "KilnModelGetOutput: data is NULL");
  } else if (need) {
    if (m->shapes) box_copy(m->tensors[o->entry].data, data, shape, m->desc->shapes + e->shape_offset, e->ndim,
                            item_bytes(e->dtype), 0);
    else memcpy(data, m->tensors[o->entry].data, (size_t)need);
  }
  pthread_mutex_unlock(&m->mu);
  return s;
}

KILN_DLL const void* KilnModelOutputData(const KilnModel* m, int32_t index) {
  if (check_index(m, index, m ? m->desc->num_outputs : 0, "KilnModelOutputData", "output") != KILN_OK) return NULL;
  return m->tensors[m->desc->outputs[index].entry].data;
}
