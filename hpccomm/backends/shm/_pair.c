/* The shared-memory all-reduce of a two-rank group, in C.
 *
 * A reduce-scatter then an all-gather, pipelined per chunk through the communicator's
 * ring (segment.py): rank 0 reduces the first half of the buffer, rank 1 the second,
 * each adds the other's staged copy of its half and both copy the other's sums back.
 *
 * The Python state machine (algorithms.py) spends several microseconds of interpreter
 * work per chunk step and about ten more per operation (descriptor, resolve, Work); at
 * 16 KiB-4 MiB that is what separated the shared-memory path from MPI. `run` does it
 * all in one call: it can publish the operation's descriptor and resolve the peer's,
 * does every chunk step whose inputs are ready and, given a time slice, waits for the
 * peer's counters itself with the GIL released. An operation unfinished after its
 * slice goes back to the state machine with its progress, which goes on calling `run`
 * between the checks of its wait (deadline, other groups' operations, MPI progress).
 *
 * Counters are read with acquire and written with release ordering, so data written
 * before a counter is seen by the reader of that counter on every architecture (on
 * x86-64 these are plain loads and stores). A `Pair` object holds what is fixed per
 * two-rank communicator: the word layout, the descriptor's bit fields, the rings' and
 * control blocks' addresses; its `run` takes only what changes per operation.
 *
 * The sums are exactly NumPy's: IEEE additions of two operands of the array's own type,
 * integers wrapping (computed unsigned, which C defines as wrapping).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_spin.h"

/* Element kinds the kernel sums (the Python side maps dtypes to them). */
enum { KIND_F32 = 1, KIND_F64 = 2, KIND_U8 = 3, KIND_U16 = 4, KIND_U32 = 5, KIND_U64 = 6 };

/* Word positions in a rank's control block (segment.py), the descriptor's fields
 * (algorithms.py) and how far staging runs ahead. */
typedef struct {
    long staged_at, reduced_at, consumed_at, enter_at, seq_shift, lookahead;
    int64_t tag_mask;
} layout_t;

/* What run() returns instead of r << 32 | s before the peer has resolved. */
#define PEER_ABSENT -1    /* the peer has not entered this operation yet */
#define PEER_MISMATCH -2  /* the peer entered it with another kind, dtype or size */
/* Bits of each of r, s and g in run()'s result (chunks per operation stay below). */
#define FIELD_BITS 21

#define SUM_LOOP(T)                                                                    \
    do {                                                                               \
        T *restrict o = (T *)own;                                                      \
        const T *restrict b = (const T *)other;                                        \
        if (own_first)                                                                 \
            for (size_t i = 0; i < n; i++)                                             \
                o[i] = (T)(o[i] + b[i]);                                               \
        else                                                                           \
            for (size_t i = 0; i < n; i++)                                             \
                o[i] = (T)(b[i] + o[i]);                                               \
    } while (0)

/* own[i] = own[i] + other[i] (own_first) or other[i] + own[i]: the peer's operand second
 * on rank 0 and first on rank 1, so that both ranks add in rank order. */
static void add(int kind, void *own, const void *other, size_t n, int own_first)
{
    switch (kind) {
    case KIND_F32: SUM_LOOP(float); break;
    case KIND_F64: SUM_LOOP(double); break;
    case KIND_U8: SUM_LOOP(uint8_t); break;
    case KIND_U16: SUM_LOOP(uint16_t); break;
    case KIND_U32: SUM_LOOP(uint32_t); break;
    case KIND_U64: SUM_LOOP(uint64_t); break;
    }
}

static size_t item_size(int kind)
{
    switch (kind) {
    case KIND_F32: case KIND_U32: return 4;
    case KIND_F64: case KIND_U64: return 8;
    case KIND_U16: return 2;
    case KIND_U8: return 1;
    }
    return 0;
}

/* One pair all-reduce: the communicator's fixed part and the operation's. */
typedef struct {
    const layout_t *at;   /* the communicator's layout */
    char *own;            /* this rank's buffer */
    long long size;       /* elements */
    int kind;
    int first;            /* this rank is rank 0 of the pair */
    long long ce;         /* elements of a half per chunk */
    long long half;       /* elements of rank 0's half (rank q reduces half q) */
    long long nch;        /* chunks */
    long long k0;         /* the communicator's number of this operation's chunk 0 */
    long long slots;      /* ring slots */
    long long slot_bytes; /* bytes of one ring slot */
    char *mine;           /* this rank's ring (data after its control block) */
    const char *theirs;   /* the peer's ring */
    int64_t *my_words;    /* this rank's counters */
    const int64_t *peer_words;
} pair_t;

/* Progress through one operation: chunks reduced, staged and (halves) gathered. */
typedef struct {
    long long r, s, g;
} progress_t;

/* Elements [lo, hi) of chunk k of `part` (0: rank 0's half, 1: rank 1's). */
static void half_span(const pair_t *p, int part, long long k, long long *lo, long long *hi)
{
    long long start = part ? p->half : 0, end = part ? p->size : p->half;
    *lo = start + k * p->ce;
    *hi = *lo + p->ce;
    if (*hi > end)
        *hi = end;
    if (*lo > *hi)
        *lo = *hi;
}

/* Do every step whose inputs are ready; returns whether any was done. Rank q reduces
 * half q. Per chunk k, a rank stages its chunk k of the peer's half into piece 0 of its
 * ring slot (STAGED), adds the peer's staged piece into its own half (in rank order)
 * and writes the sum both into its buffer and into piece 1 of its slot (REDUCED), and
 * copies the peer's sum from the peer's piece 1 into its buffer once it has reduced
 * that chunk itself (CONSUMED: both pieces of the peer's slot are read, so the peer may
 * reuse it `slots` chunks later). Staging runs at most `lookahead` chunks ahead. */
static int advance(const pair_t *p, progress_t *at)
{
    long long r = at->r, s = at->s, g = at->g;
    size_t item = item_size(p->kind);
    int me = p->first ? 0 : 1, moved = 0;
    long long piece = p->slot_bytes / 2;
    for (;;) {
        int step = 0;
        long long lo, hi;
        if (g < r && __atomic_load_n(&p->peer_words[p->at->reduced_at], __ATOMIC_ACQUIRE) > p->k0 + g) {
            half_span(p, 1 - me, g, &lo, &hi);
            if (hi > lo)
                memcpy(p->own + lo * item,
                       p->theirs + ((p->k0 + g) % p->slots) * p->slot_bytes + piece,
                       (size_t)(hi - lo) * item);
            g++;
            __atomic_store_n(&p->my_words[p->at->consumed_at], p->k0 + g, __ATOMIC_RELEASE);
            step = 1;
        }
        if (r < s && __atomic_load_n(&p->peer_words[p->at->staged_at], __ATOMIC_ACQUIRE) > p->k0 + r) {
            half_span(p, me, r, &lo, &hi);
            if (hi > lo) {
                char *own = p->own + lo * item;
                long long slot = ((p->k0 + r) % p->slots) * p->slot_bytes;
                add(p->kind, own, p->theirs + slot, (size_t)(hi - lo), p->first);
                memcpy(p->mine + slot + piece, own, (size_t)(hi - lo) * item);
            }
            r++;
            __atomic_store_n(&p->my_words[p->at->reduced_at], p->k0 + r, __ATOMIC_RELEASE);
            step = 1;
        }
        if (s < p->nch && s < g + p->at->lookahead &&
            __atomic_load_n(&p->peer_words[p->at->consumed_at], __ATOMIC_ACQUIRE) > p->k0 + s - p->slots) {
            half_span(p, 1 - me, s, &lo, &hi);
            if (hi > lo)
                memcpy(p->mine + ((p->k0 + s) % p->slots) * p->slot_bytes, p->own + lo * item,
                       (size_t)(hi - lo) * item);
            s++;
            __atomic_store_n(&p->my_words[p->at->staged_at], p->k0 + s, __ATOMIC_RELEASE);
            step = 1;
        }
        if (!step)
            break;
        moved = 1;
    }
    at->r = r;
    at->s = s;
    at->g = g;
    return moved;
}

static int finished(const pair_t *p, const progress_t *at)
{
    return at->g == p->nch;  /* g <= r */
}

static void *address_of(PyObject *value)
{
    return (void *)(uintptr_t)PyLong_AsUnsignedLongLongMask(value);
}

/* 1 once the peer has entered operation `seq` (or a later one, done with this one),
 * 0 while it has not, -1 if it entered `seq` with another
 * tag. */
static int peer_entered(const pair_t *p, int64_t seq, int64_t tag)
{
    int64_t value = __atomic_load_n(&p->peer_words[p->at->enter_at], __ATOMIC_ACQUIRE);
    int64_t entered = value >> p->at->seq_shift;
    if (entered < seq)
        return 0;
    if (entered == seq && (value & p->at->tag_mask) != tag)
        return -1;
    return 1;
}

/* A two-rank communicator's kernel: its layout and the fixed part of every pair_t. */
typedef struct {
    PyObject_HEAD
    layout_t layout;
    pair_t fixed; /* first, slots, slot_bytes, mine, theirs, my_words, peer_words */
} PairObject;

static int pair_init(PairObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"first", "slots", "slot_bytes", "mine", "theirs", "my_words",
                            "peer_words", "staged", "reduced", "consumed", "enter",
                            "seq_shift", "tag_mask", "lookahead", NULL};
    int first;
    long long slots, slot_bytes;
    unsigned long long mine, theirs, my_words, peer_words;
    layout_t l;
    long long mask;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$pLLKKKKlllllLl", names, &first, &slots,
                                     &slot_bytes, &mine, &theirs, &my_words, &peer_words,
                                     &l.staged_at, &l.reduced_at, &l.consumed_at,
                                     &l.enter_at, &l.seq_shift, &mask, &l.lookahead))
        return -1;
    l.tag_mask = mask;
    if (l.staged_at < 0 || l.reduced_at < 0 || l.consumed_at < 0 || l.enter_at < 0 ||
        l.seq_shift <= 0 || l.seq_shift > 62 || l.lookahead < 1 || slots <= 0 ||
        slot_bytes <= 0 || !mine || !theirs || !my_words || !peer_words) {
        PyErr_SetString(PyExc_ValueError, "Pair: impossible layout or ring");
        return -1;
    }
    self->layout = l;
    memset(&self->fixed, 0, sizeof self->fixed);
    self->fixed.at = &self->layout;
    self->fixed.first = first;
    self->fixed.slots = slots;
    self->fixed.slot_bytes = slot_bytes;
    self->fixed.mine = (char *)(uintptr_t)mine;
    self->fixed.theirs = (const char *)(uintptr_t)theirs;
    self->fixed.my_words = (int64_t *)(uintptr_t)my_words;
    self->fixed.peer_words = (const int64_t *)(uintptr_t)peer_words;
    return 0;
}

/* Pair.run(own, count, kind, ce, half, nch, k0, enter, r, s, g, slice, yield_every) -> int
 *
 * One all-reduce of `count` elements of `kind` at `own` over the pair (rank 0 reduces
 * elements [0, half), rank 1 the rest), from chunk state (r, s, g). With `enter` != 0
 * the operation has not begun: publish `enter` as this rank's descriptor and wait for
 * the peer's first. Does every step that is ready; with `slice` > 0 also waits for the
 * peer (GIL released) until the operation is done or `slice` seconds pass, yielding the
 * core every `yield_every` idle polls (0: never). Returns r << 42 | s << 21 | g (done
 * when r == g == nch), or PEER_ABSENT / PEER_MISMATCH. The buffers stay the caller's:
 * the Python side keeps the ring and `own` alive while an operation runs. */
static PyObject *pair_run(PairObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "Pair.run() takes 13 arguments");
        return NULL;
    }
    pair_t p = self->fixed;
    progress_t at;
    p.own = address_of(args[0]);
    p.size = PyLong_AsLongLong(args[1]);
    p.kind = (int)PyLong_AsLong(args[2]);
    p.ce = PyLong_AsLongLong(args[3]);
    p.half = PyLong_AsLongLong(args[4]);
    p.nch = PyLong_AsLongLong(args[5]);
    p.k0 = PyLong_AsLongLong(args[6]);
    int64_t enter = PyLong_AsLongLong(args[7]);
    at.r = PyLong_AsLongLong(args[8]);
    at.s = PyLong_AsLongLong(args[9]);
    at.g = PyLong_AsLongLong(args[10]);
    double slice = PyFloat_AsDouble(args[11]);
    long yield_every = PyLong_AsLong(args[12]);
    if (PyErr_Occurred())
        return NULL;
    if (!item_size(p.kind) || p.ce <= 0 || !p.own || p.nch < 0 ||
        p.nch >= (1LL << FIELD_BITS) || p.half < 0 || p.half > p.size || at.r < 0 ||
        at.s < at.r || at.s > p.nch || at.g < 0 || at.g > at.r ||
        p.ce * (long long)item_size(p.kind) > p.slot_bytes / 2) {
        PyErr_SetString(PyExc_ValueError, "Pair.run: inconsistent arguments");
        return NULL;
    }
    long long result;
    int64_t seq = enter >> p.at->seq_shift, tag = enter & p.at->tag_mask;
    Py_BEGIN_ALLOW_THREADS
    int entered = 1;
    if (enter) {
        __atomic_store_n(&p.my_words[p.at->enter_at], enter, __ATOMIC_RELEASE);
        entered = peer_entered(&p, seq, tag);
    }
    if (entered > 0)
        advance(&p, &at);
    if (entered >= 0 && slice > 0 && !finished(&p, &at)) {
        spin_t turn = spin_start(slice, yield_every);
        while (!finished(&p, &at)) {
            if (entered == 0) {
                entered = peer_entered(&p, seq, tag);
                if (entered < 0)
                    break;
                if (entered > 0)
                    continue;
            } else if (advance(&p, &at)) {
                continue;
            }
            if (spin_idle(&turn))
                break;
        }
    }
    result = entered < 0 ? PEER_MISMATCH : entered == 0 ? PEER_ABSENT
             : (at.r << (2 * FIELD_BITS)) | (at.s << FIELD_BITS) | at.g;
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(result);
}

static PyMethodDef pair_methods[] = {
    {"run", (PyCFunction)(void (*)(void))pair_run, METH_FASTCALL,
     "run(own, count, kind, ce, half, nch, k0, enter, r, s, g, slice, yield_every) -> "
     "r << 42 | s << 21 | g, or a negative status."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PairType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hpccomm.backends.shm._pair.Pair",
    .tp_doc = "Pair(*, first, slots, slot_bytes, mine, theirs, my_words, peer_words, "
              "staged, reduced, consumed, enter, seq_shift, tag_mask, lookahead): the "
              "kernel of one two-rank communicator (its ring, control blocks and layout).",
    .tp_basicsize = sizeof(PairObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pair_init,
    .tp_methods = pair_methods,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_pair",
    .m_doc = "The two-rank shared-memory all-reduce in C (see pair.py).",
    .m_size = -1,
};

/* The module, with the constants the Python side reads rather than repeats. */
PyMODINIT_FUNC PyInit__pair(void)
{
    if (PyType_Ready(&PairType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&PairType);
    if (PyModule_AddObject(m, "Pair", (PyObject *)&PairType) < 0) {
        Py_DECREF(&PairType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "PEER_ABSENT", PEER_ABSENT) < 0 ||
        PyModule_AddIntConstant(m, "PEER_MISMATCH", PEER_MISMATCH) < 0 ||
        PyModule_AddIntConstant(m, "FIELD_BITS", FIELD_BITS) < 0 ||
        PyModule_AddIntConstant(m, "KIND_F32", KIND_F32) < 0 ||
        PyModule_AddIntConstant(m, "KIND_F64", KIND_F64) < 0 ||
        PyModule_AddIntConstant(m, "KIND_U8", KIND_U8) < 0 ||
        PyModule_AddIntConstant(m, "KIND_U16", KIND_U16) < 0 ||
        PyModule_AddIntConstant(m, "KIND_U32", KIND_U32) < 0 ||
        PyModule_AddIntConstant(m, "KIND_U64", KIND_U64) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
