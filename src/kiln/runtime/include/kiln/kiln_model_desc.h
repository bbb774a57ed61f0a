/*
 * The tables a Kiln library carries for its C API (kiln_model.h): one KilnModelDesc per model.
 *
 * Internal to Kiln libraries: `export_library` generates `kiln_model.c` from the graph JSON
 * (kiln/runtime/model_api.py) -- these tables, then the fixed implementation in
 * kiln/runtime/crt/kiln_model_api.c -- and compiles it into the library. An application never
 * includes this header; it is documented in docs/c_api.md for readers of the generated file.
 *
 * Entries, storage slots, ops and names mean what they mean in the graph JSON
 * (docs/graph_json_format.md): an entry is one node output, entries with the same storage slot
 * share memory (each slot is sized for its largest entry), a `__nop` output uses its input's slot
 * (the generator resolves it) and is not an op here.
 *
 * A graph with dynamic dimensions (docs/dynamic_shapes.md) keeps every entry's storage at its
 * upper-bound shape (`shapes` holds the upper bounds) and adds its symbols, each distinct symbolic
 * dim as an expression (computed together by `eval_dims`) and, per dim of `shapes`, the expression
 * that gives it. Static graphs have num_symbols = 0 and NULL there.
 *
 * A data-dependent symbol (NonZero's count ...) is given by no input but reported by a kernel
 * (kiln.tir.set_extent writes it into the shape of the kernel's output DLTensor); its
 * KilnSymbolDesc has input -1 and names that kernel's op. Tables that have one are version 3,
 * all others version 2 (the same layout, with dim_expr_after left out), so that code reading only
 * version 2 refuses them.
 */
#ifndef KILN_MODEL_DESC_H_
#define KILN_MODEL_DESC_H_

#include <kiln/kiln_model.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t storage;      /* storage slot holding the entry's data (at byte_offset) */
  int32_t ndim;
  int32_t shape_offset; /* index of the first dim in KilnModelDesc.shapes */
  DLDataType dtype;
  uint64_t nbytes;
  uint64_t byte_offset; /* where in the slot (non-zero for the inputs of an in-place concat) */
} KilnEntryDesc;

enum { KILN_OP_CALL = 0, KILN_OP_COPY = 1 };

typedef struct {
  KilnBackendPackedCFunc fn; /* the kernel (NULL for a copy) */
  const char* name;          /* graph node name, for errors */
  const char* func_name;
  int32_t kind;              /* KILN_OP_CALL or KILN_OP_COPY */
  int32_t first_arg;         /* index of the first argument entry in KilnModelDesc.op_args */
  int32_t num_args;          /* inputs then outputs */
  int32_t flatten;           /* pass every argument as a 1-D tensor (graph JSON flatten_data) */
} KilnOpDesc;

typedef struct {
  const char* name;
  int32_t entry;
} KilnNamedEntry;

/* A symbol (dynamic dimension): its range, and the first input dim that is exactly this symbol
 * (inputs give the symbols their values), or for a data-dependent symbol the op whose kernel
 * reports its value (read from the first of the op's argument dims that is the symbol). */
typedef struct {
  const char* name;
  int64_t lo, hi;
  int32_t input; /* index into KilnModelDesc.inputs; -1: data-dependent */
  int32_t dim;   /* the dim of that input; data-dependent: the index in KilnModelDesc.ops of its kernel */
} KilnSymbolDesc;

/* A distinct symbolic dim: its canonical text (kiln.runtime.sym, e.g. "batch*seq") and the first
 * symbol it uses (for messages). Expression i < num_symbols is symbol i itself. */
typedef struct {
  const char* text;
  int32_t symbol;
} KilnDimExprDesc;

/* The table versions this code reads (KilnModelDesc.api_version; others are KILN_ERR_FORMAT). */
#define KILN_MODEL_TABLES_MIN_VERSION 2
#define KILN_MODEL_TABLES_VERSION 3

/* Writes values[i] of every dim expression i from the symbols' values (floor division floors). */
typedef void (*KilnEvalDimsFunc)(const int64_t* symbols, int64_t* values);

/* a // b for b > 0, rounding towards minus infinity as kiln.runtime.sym (and Python) do. */
static inline int64_t KilnFloorDiv(int64_t a, int64_t b) { return a / b - (a % b < 0); }

typedef struct {
  int32_t api_version;        /* the tables' version: 2, or 3 with data-dependent symbols */
  const char* mod_name;       /* the factory's module name ("default") */
  const char* unsupported;    /* NULL, or why this model cannot run through the C API */
  int32_t num_entries;
  const KilnEntryDesc* entries;
  const int64_t* shapes;
  int32_t num_storage;
  const uint64_t* storage_bytes;
  int32_t num_ops;
  const KilnOpDesc* ops;
  const int32_t* op_args;
  int32_t num_inputs;
  const KilnNamedEntry* inputs;
  int32_t num_outputs;
  const KilnNamedEntry* outputs; /* names "output0", ... (the graph JSON has none) */
  int32_t num_params;
  const KilnNamedEntry* params;
  const uint8_t* blob;           /* the module blob section (u64 length + blob), or NULL */
  KilnBackendPackedCFunc linked_param_lookup; /* _lookup_linked_param of a link_params build, or NULL */
  /* dynamic dimensions (all 0 / NULL for a static graph) */
  int32_t num_symbols;
  const KilnSymbolDesc* symbols;
  int32_t num_dim_exprs;
  const KilnDimExprDesc* dim_exprs;
  KilnEvalDimsFunc eval_dims;
  const int32_t* dim_expr;       /* per dim of `shapes`: -1 static, else the index of the expression giving it */
  /* version 3 only (NULL in version-2 tables, which end at dim_expr): per dim expression, -1 if it
   * uses no data-dependent symbol, else the index in `ops` of the last kernel reporting one it
   * uses -- in a run, its value is known only once that kernel ran */
  const int32_t* dim_expr_after;
} KilnModelDesc;

/* One build of a portable library (kiln.build_portable): its tables and the CPU features it needs,
 * spelled as /proc/cpuinfo lists them, space-separated. Best variant first. */
typedef struct {
  const KilnModelDesc* desc;
  const char* mod_name;
  const char* cpu_flags;
} KilnModelVariant;

/* Implemented in kiln_model_api.c; KilnModelCreate(params, out) is this with the model's tables. */
int32_t KilnModelCreateFromDesc(const KilnModelDesc* desc, const char* params_path, KilnModel** out);
/* The variant to run on this CPU: KILN_ISA_VARIANT's, else the first whose flags the CPU has (the last,
 * least demanding one when the CPU's flags cannot be read); -1 (last error set) if none can run. */
int32_t KilnModelSelectVariant(const KilnModelVariant* variants, int32_t n);

#ifdef __cplusplus
}
#endif
#endif /* KILN_MODEL_DESC_H_ */
