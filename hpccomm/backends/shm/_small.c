/* Small collectives through shared memory: every rank posts its contribution into a
 * slot of its own region and raises its `posted` counter; every rank that needs it
 * waits for the counters it needs, then reads the peers' slots in rank order and raises
 * its `done` counter. One operation is a handful of cache-line transfers, where MPI's
 * nonblocking collectives cost a few microseconds of progress engine.
 *
 * Layout of each rank's region (written only by its owner, read by every rank):
 *
 *   [0]    posted: the sequence number of the last operation whose data is in its slot
 *   [128]  done:   the last operation this rank has finished reading
 *   [192]  reduced: the last split all_reduce whose part this rank has reduced
 *   [256]  one 64-byte header per slot: seq, operation, bytes, element kind, reduction,
 *          root and the bytes of the whole call it belongs to (an all_reduce too large
 *          for one slot goes in pieces), written with the data, so a reader checks that
 *          every rank called the same operation with the same arguments
 *   [...]  the counters of the hand-off's tree nodes this rank owns (_handoff.h), one
 *          line per level, kind and slot, written by every rank of the node (atomics)
 *   [...]  `slots` data slots of `slot_bytes` each
 *
 * Operation `seq` uses slot `seq % slots`. A rank writes that slot only once every rank
 * has finished reading the operation `slots` earlier (their `done`), so up to `slots`
 * operations of one rank may be in flight (async_op). Counters only grow: a reader
 * compares with the value it needs and never misses an update. The owner writes data,
 * header, then `posted` with release order; a reader loads `posted` with acquire order,
 * then the data (portable beyond x86's ordered stores and loads).
 *
 * Reductions read the slots in rank order, so every rank computes the same result,
 * bit for bit; the element kinds and their kernels are in _reduce.h.
 *
 * An all_reduce of at least `split_from` bytes (groups of 3 or more ranks) is split so
 * that what a rank reads does not grow with the group: rank r reduces only part r (the
 * r-th of n pieces of whole 64-byte lines) from every rank's slot into its own output,
 * copies it back over part r of its own slot, whose input no other rank reads, and
 * raises its `reduced` counter; once every rank's is raised, each copies the n - 1
 * other reduced parts from their owners' slots. A rank reads about 2 S instead of n S,
 * for one more hand-off of counters. Each part is still reduced in rank order, so the
 * result is the same, bit for bit, as the whole reduction's.
 *
 * A reduce_scatter posts the blocks of its input the other ranks reduce (rank r's at
 * r * nbytes of the slot) and reads its own where it lies, unless its output overlaps
 * it. One larger than a slot goes in pieces: each operation posts the same strided
 * piece of every block (`offset`, `stride` into the input), so a rank reads about 2 S
 * whatever n.
 *
 * Every rank counts the bytes it reads and writes (`traffic`), its own slot included,
 * so a test can check what an operation costs a rank at any group size. Copies
 * (broadcast, all_gather, all_to_all, barrier) take any element type it names.
 *
 * The object keeps a queue of operations started and not finished (async_op, or a wait
 * given up at its slice); they are posted and finished in order. `run` is the whole
 * synchronous operation in one call: it spins, without the GIL after the first few
 * microseconds, until done or until its slice is over, when the operation joins the
 * queue and the caller waits for it the general way (deadline, errors, signals).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_spin.h"
#include "_reduce.h"

enum { OP_BARRIER, OP_ALL_REDUCE, OP_BROADCAST, OP_ALL_GATHER, OP_REDUCE_SCATTER,
       OP_ALL_TO_ALL, N_OPS };
static const char *OP_NAMES[N_OPS] = {"barrier", "all_reduce", "broadcast", "all_gather",
                                      "reduce_scatter", "all_to_all"};

#define POSTED_AT 0
#define DONE_AT 128
#define REDUCED_AT 192 /* split all_reduce: the last operation whose part is reduced */
#define HEADERS_AT 256
#define HEADER_BYTES 64
#define QUEUE 1024 /* operations started and not finished, per communicator: an all_reduce
                    * of up to 128 MiB in 256 KiB pieces, and others */
#define MAX_LEVELS 16 /* levels of the hand-off's tree: radix 2 up to 65536 ranks */
#define MAX_SLOTS 16
/* Spins this long with the GIL held before releasing it: a small operation whose peers
 * are already there is over before that, and pays no GIL hand-over. */
#define HELD_SPIN_S 20e-6

typedef struct {
    uint64_t seq;
    int32_t op, kind, redop, root;
    int64_t nbytes;
    int64_t total;           /* bytes of the whole call (nbytes, but for a piece) */
} header_t;

typedef struct {
    uint64_t seq;
    int op, kind, redop, root, posted;
    int split, reduced;      /* split all_reduce; its part reduced and published */
    uint64_t split_use;      /* split all_reduce: the split uses of its slot, this one's */
    Py_ssize_t nbytes;       /* the operation's size, as every rank must give it */
    Py_ssize_t total;        /* the whole call's size (of which this is a piece) */
    Py_ssize_t post_bytes;   /* bytes of this rank's contribution */
    Py_ssize_t offset, stride; /* reduce_scatter: the n blocks it posts start at
                              * offset + r * stride of the send buffer (a piece of each
                              * block when stride > nbytes) */
    const char *mine;        /* reduce_scatter: this rank's own block, read in place
                              * (never posted: no other rank reads it), or NULL */
    Py_buffer send, recv;    /* recv.buf NULL: none (a barrier) */
    int has_send, has_recv;
} op_t;

typedef struct {
    PyObject_HEAD
    int rank, size, slots;
    Py_ssize_t slot_bytes, tree_at, data_at;
    char **regions;            /* every rank's region */
    Py_ssize_t limits[N_OPS];  /* largest operation size per operation (0: never) */
    uint64_t next;             /* sequence number of the next operation */
    op_t queue[QUEUE];
    int head, count;
    int busy;                  /* a spin without the GIL runs on this object */
    int closed;                /* the segment is gone: every call raises */
    PyObject *broken;          /* the mismatch that broke the channel: every call raises */
    double slice;
    long yield_every;
    Py_ssize_t split_from;     /* all_reduce bytes from which it is split (0: never) */
    unsigned long long read, written; /* bytes this rank has read and written */
    /* the hand-off (_handoff.h): flat (levels 0) or a combining tree */
    int radix, levels;
    int children[MAX_LEVELS];  /* children of this rank's node at each level */
    char *nodes[MAX_LEVELS];   /* that node's counters */
    uint64_t split_uses[MAX_SLOTS]; /* split all_reduces per slot so far */
    unsigned long long polled, signalled; /* hand-off lines polled and written */
} Small;

static inline uint64_t load(Small *self, int rank, Py_ssize_t at)
{
    return __atomic_load_n((uint64_t *)(self->regions[rank] + at), __ATOMIC_ACQUIRE);
}

static inline void store(Small *self, Py_ssize_t at, uint64_t value)
{
    __atomic_store_n((uint64_t *)(self->regions[self->rank] + at), value, __ATOMIC_RELEASE);
}

static inline header_t *header(Small *self, int rank, uint64_t seq)
{
    return (header_t *)(self->regions[rank] + HEADERS_AT +
                        (Py_ssize_t)(seq % (uint64_t)self->slots) * HEADER_BYTES);
}

static inline char *slot(Small *self, int rank, uint64_t seq)
{
    return self->regions[rank] + self->data_at +
           (Py_ssize_t)(seq % (uint64_t)self->slots) * self->slot_bytes;
}

/* Counts a copy of `nbytes` (read once, written once) in this rank's traffic. */
static inline void copied(Small *self, Py_ssize_t nbytes)
{
    self->read += (unsigned long long)nbytes;
    self->written += (unsigned long long)nbytes;
}

/* Where rank r's `nbytes` at `offset` of op's slot are: this rank's own block of a
 * reduce_scatter in its send buffer (`mine`), all else in the slot. */
static inline const char *source(Small *self, op_t *op, int r, Py_ssize_t offset)
{
    return r == self->rank && op->mine ? op->mine : slot(self, r, op->seq) + offset;
}

/* out = the reduction, in rank order, of `nbytes` at `offset` of every rank's slot */
static void reduce_slots(Small *self, op_t *op, char *out, Py_ssize_t offset,
                         Py_ssize_t nbytes)
{
    int r;
    self->read += (unsigned long long)nbytes * (unsigned long long)self->size;
    self->written += (unsigned long long)nbytes;
    combine(op->kind, op->redop, out, source(self, op, 0, offset),
            source(self, op, 1, offset), nbytes);
    for (r = 2; r < self->size; r++)
        combine(op->kind, op->redop, out, out, source(self, op, r, offset), nbytes);
}

/* -- one operation's steps ----------------------------------------------------------- */

#include "_handoff.h"
#include "_mismatch.h"

static void post(Small *self, op_t *op)
{
    header_t *h = header(self, self->rank, op->seq);
    if (op->op == OP_REDUCE_SCATTER) { /* every block the others read (or a piece of
                                        * each): rank r's at r * nbytes of the slot */
        int r;
        for (r = 0; r < self->size; r++)
            if (r != self->rank || !op->mine)
                memcpy(slot(self, self->rank, op->seq) + r * op->nbytes,
                       (char *)op->send.buf + op->offset + r * op->stride,
                       (size_t)op->nbytes);
    } else if (op->post_bytes) {
        memcpy(slot(self, self->rank, op->seq), op->send.buf, (size_t)op->post_bytes);
    }
    h->seq = op->seq;
    h->op = op->op;
    h->kind = op->kind;
    h->redop = op->redop;
    h->root = op->root;
    h->nbytes = op->nbytes;
    h->total = op->total;
    op->posted = 1;
    op->split = op->op == OP_ALL_REDUCE && self->split_from > 0 && self->size > 2 &&
                op->nbytes >= self->split_from;
    if (op->split)
        op->split_use = ++self->split_uses[op->seq % (uint64_t)self->slots];
    signal_posted(self, op);
    self->read += (unsigned long long)op->post_bytes;
    self->written += (unsigned long long)op->post_bytes;
}

/* Read what op needs from the slots, then raise `done`. */
static void finish(Small *self, op_t *op)
{
    int r, me = self->rank;
    char *out = (char *)op->recv.buf;
    Py_ssize_t block;
    switch (op->op) {
    case OP_ALL_REDUCE:
        reduce_slots(self, op, out, 0, op->nbytes);
        break;
    case OP_BROADCAST:
        if (me != op->root) {
            memcpy(out, slot(self, op->root, op->seq), (size_t)op->nbytes);
            copied(self, op->nbytes);
        }
        break;
    case OP_ALL_GATHER: /* nbytes: one rank's block */
        for (r = 0; r < self->size; r++)
            memcpy(out + r * op->nbytes, slot(self, r, op->seq), (size_t)op->nbytes);
        copied(self, op->nbytes * self->size);
        break;
    case OP_REDUCE_SCATTER: /* nbytes: one rank's block of the result */
        reduce_slots(self, op, out, me * op->nbytes, op->nbytes);
        break;
    case OP_ALL_TO_ALL:
        block = op->nbytes;
        for (r = 0; r < self->size; r++)
            memcpy(out + r * block, slot(self, r, op->seq) + me * block, (size_t)block);
        copied(self, block * self->size);
        break;
    }
    signal_done(self, op);
}

/* -- the split all_reduce -------------------------------------------------------------- */

/* Bytes of each part: n parts of whole 64-byte lines (a multiple of every element size),
 * the last ones shorter or empty. Part r is [r * part, min((r + 1) * part, nbytes)). */
static inline Py_ssize_t part_bytes(Small *self, op_t *op)
{
    Py_ssize_t lines = (op->nbytes + 63) / 64;
    return (lines + self->size - 1) / self->size * 64;
}

static inline Py_ssize_t part_length(Small *self, op_t *op, int r)
{
    Py_ssize_t part = part_bytes(self, op), lo = r * part;
    return lo >= op->nbytes ? 0 : (op->nbytes - lo < part ? op->nbytes - lo : part);
}

/* Reduce this rank's part from every slot into the output, publish it over the same
 * part of this rank's slot (no other rank reads that part of it), raise `reduced`. */
static void reduce_part(Small *self, op_t *op)
{
    int me = self->rank;
    Py_ssize_t lo = me * part_bytes(self, op), len = part_length(self, op, me);
    if (len) {
        char *out = (char *)op->recv.buf + lo;
        reduce_slots(self, op, out, lo, len);
        memcpy(slot(self, me, op->seq) + lo, out, (size_t)len);
        copied(self, len);
    }
    signal_reduced(self, op);
    op->reduced = 1;
}

/* Copy the other ranks' reduced parts from their slots, then raise `done`. */
static void gather_parts(Small *self, op_t *op)
{
    int r;
    Py_ssize_t part = part_bytes(self, op);
    for (r = 0; r < self->size; r++) {
        Py_ssize_t len = part_length(self, op, r);
        if (r == self->rank || !len)
            continue;
        memcpy((char *)op->recv.buf + r * part, slot(self, r, op->seq) + r * part,
               (size_t)len);
        copied(self, len);
    }
    signal_done(self, op);
}

/* One step of op: post it if its slot is free, finish it if its peers are there (a
 * split all_reduce: reduce its part then, and finish once every part is reduced).
 * Returns 1 when finished, 0 when not yet, -1 on a mismatch (*bad: the rank). */
static int step(Small *self, op_t *op, int *bad)
{
    if (!op->posted) {
        if (!slot_free(self, op))
            return 0;
        post(self, op);
    }
    if (!op->reduced) {
        if (!arrived(self, op))
            return 0;
        if (mismatch(self, op, bad))
            return -1;
        if (!op->split) {
            finish(self, op);
            return 1;
        }
        reduce_part(self, op);
    }
    if (!parts_reduced(self, op))
        return 0;
    gather_parts(self, op);
    return 1;
}

static void release(op_t *op)
{
    if (op->has_send)
        PyBuffer_Release(&op->send);
    if (op->has_recv)
        PyBuffer_Release(&op->recv);
    op->has_send = op->has_recv = 0;
}

/* -- describing an operation from Python's arguments: _small_args.h -------------------- */
#include "_small_args.h"

/* -- the object ------------------------------------------------------------------------ */

static int Small_init(Small *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"rank", "size", "slots", "slot_bytes", "regions", "limits",
                            "slice", "yield_every", "split_from", "radix", NULL};
    PyObject *regions, *limits;
    Py_ssize_t i;
    int radix = 0;
    self->split_from = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiinOOdl|ni", names, &self->rank,
                                     &self->size, &self->slots, &self->slot_bytes,
                                     &regions, &limits, &self->slice, &self->yield_every,
                                     &self->split_from, &radix))
        return -1;
    if (self->size < 2 || self->rank < 0 || self->rank >= self->size || self->slots < 2 ||
        self->slots > MAX_SLOTS ||
        self->slot_bytes % 64 || !PySequence_Check(regions) ||
        PySequence_Size(regions) != self->size || !PySequence_Check(limits) ||
        PySequence_Size(limits) != N_OPS) {
        PyErr_SetString(PyExc_ValueError, "Small: inconsistent layout");
        return -1;
    }
    self->tree_at = head_layout(self->slots, &self->data_at);
    self->regions = PyMem_Calloc((size_t)self->size, sizeof(char *));
    if (self->regions == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < self->size; i++) {
        PyObject *item = PySequence_GetItem(regions, i);
        if (item == NULL)
            return -1;
        self->regions[i] = (char *)PyLong_AsVoidPtr(item);
        Py_DECREF(item);
        if (PyErr_Occurred())
            return -1;
    }
    for (i = 0; i < N_OPS; i++) {
        PyObject *item = PySequence_GetItem(limits, i);
        if (item == NULL)
            return -1;
        self->limits[i] = PyLong_AsSsize_t(item);
        Py_DECREF(item);
        if (PyErr_Occurred())
            return -1;
    }
    if (tree_layout(self, radix) < 0)
        return -1;
    /* a fresh segment is zeroed: counters start at 0, operations at 1 */
    self->next = load(self, self->rank, POSTED_AT) + 1;
    return 0;
}

static void Small_dealloc(Small *self)
{
    int i;
    for (i = 0; i < self->count; i++)
        release(&self->queue[(self->head + i) % QUEUE]);
    PyMem_Free(self->regions);
    Py_XDECREF(self->broken);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Steps the queue's operations in order, once each, as far as they go. Returns -1 on a
 * mismatch (error set), else how many were finished. */
static int progress(Small *self)
{
    int finished = 0;
    while (self->count) {
        op_t *op = &self->queue[self->head];
        int bad, state = step(self, op, &bad);
        if (state < 0) {
            raise_mismatch(self, op, bad);
            return -1;
        }
        if (!state) {
            /* a later operation may be posted already if its slot is free (in order) */
            int i;
            for (i = 1; i < self->count; i++) {
                op_t *later = &self->queue[(self->head + i) % QUEUE];
                if (later->posted)
                    continue;
                if (!self->queue[(self->head + i - 1) % QUEUE].posted || !slot_free(self, later))
                    break;
                post(self, later);
            }
            break;
        }
        release(op);
        self->head = (self->head + 1) % QUEUE;
        self->count--;
        finished++;
    }
    return finished;
}

/* start(operation, send, recv, redop, root[, total[, offset, stride]]) -> seq, or 0
 * when the small path does not take this operation. `total`: the bytes of the whole
 * call, when this is a piece of it (the ranks compare it too). `stride` (a
 * reduce_scatter's piece): the send buffer holds n blocks `stride` bytes apart, of
 * which this operation takes `len(recv)` bytes at `offset` of each. The operation is
 * posted at once if its slot is free. */
static PyObject *Small_start(Small *self, PyObject *args)
{
    int code, root;
    Py_ssize_t total = 0, offset = 0, stride = 0;
    PyObject *send, *recv, *redop;
    op_t *op;
    if (!PyArg_ParseTuple(args, "iOOOi|nnn", &code, &send, &recv, &redop, &root, &total,
                          &offset, &stride) || gone(self))
        return NULL;
    if (self->count == QUEUE) {
        if (!self->busy && progress(self) < 0)
            return NULL;
        if (self->count == QUEUE)
            return PyLong_FromLong(-1); /* full: the caller waits for the oldest */
    }
    op = &self->queue[(self->head + self->count) % QUEUE];
    switch (describe(self, op, code, send, recv, redop, root, 0, offset, stride)) {
    case -1: return NULL;
    case 0: return PyLong_FromLong(0);
    }
    if (total > op->nbytes)
        op->total = total;
    op->seq = self->next++;
    self->count++;
    /* while another thread spins on the head without the GIL, only that thread steps */
    if (!self->busy && progress(self) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(op->seq);
}

/* Whether operation seq is finished (done <= the last finished one). */
static int finished(Small *self, uint64_t seq)
{
    return self->count == 0 || self->queue[self->head].seq > seq;
}

/* test(seq) -> whether operation seq (and every earlier one) is finished; one pass of
 * steps, no waiting. */
static PyObject *Small_test(Small *self, PyObject *arg)
{
    uint64_t seq = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred() || gone(self))
        return NULL;
    if (self->busy)
        Py_RETURN_FALSE;
    if (!finished(self, seq) && progress(self) < 0)
        return NULL;
    return PyBool_FromLong(finished(self, seq));
}

/* The synchronous operation at the queue's head, just described: spin until done or
 * the slice is over. Returns 0 once done, its seq while it runs (it stays queued), or
 * NULL on a mismatch. */
static PyObject *spin_head(Small *self, op_t *op)
{
    int bad = 0, state;
    spin_t turn;
    op->seq = self->next++;
    self->count = 1; /* in the queue from now on, whatever happens */
    turn = spin_start(HELD_SPIN_S, self->yield_every);
    while ((state = step(self, op, &bad)) == 0) {
        if (spin_idle(&turn))
            break;
    }
    if (state == 0 && self->slice > HELD_SPIN_S) {
        PyThreadState *saved;
        self->busy = 1;
        saved = PyEval_SaveThread();
        turn = spin_start(self->slice - HELD_SPIN_S, self->yield_every);
        while ((state = step(self, op, &bad)) == 0) {
            if (spin_idle(&turn))
                break;
        }
        PyEval_RestoreThread(saved);
        self->busy = 0;
    }
    if (state < 0) {
        raise_mismatch(self, op, bad);
        return NULL;
    }
    if (state == 0)
        return PyLong_FromUnsignedLongLong(op->seq);
    release(op);
    self->head = (self->head + 1) % QUEUE;
    self->count--; /* other threads may have queued operations during the spin */
    return PyLong_FromLong(0);
}

/* run(operation, send, recv, redop, root) -> 0 once done; -1 when the small path does
 * not take it here (the caller takes the general path: start, then test); else the
 * sequence number of the operation, still running after the slice (queued: the caller
 * waits for it with test). */
static PyObject *Small_run(Small *self, PyObject *const *args, Py_ssize_t nargs)
{
    int code, root, state;
    PyObject *send, *recv, *redop;
    op_t *op;
    /* the hottest entry: arguments taken by hand (METH_FASTCALL), not parsed by format */
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "run(operation, send, recv, redop, root)");
        return NULL;
    }
    code = (int)PyLong_AsLong(args[0]);
    root = (int)PyLong_AsLong(args[4]);
    if ((code == -1 || root == -1) && PyErr_Occurred())
        return NULL;
    send = args[1];
    recv = args[2];
    redop = args[3];
    if (gone(self))
        return NULL;
    if (self->count || self->busy)
        return PyLong_FromLong(-1);
    op = &self->queue[self->head];
    state = describe(self, op, code, send, recv, redop, root, 1, 0, 0);
    if (state <= 0)
        return state < 0 ? NULL : PyLong_FromLong(-1);
    return spin_head(self, op);
}

/* sum_at(address, nbytes, kind) -> as run, for an in-place SUM all-reduce of memory the
 * caller keeps alive until the operation is over (a torch tensor's storage). */
static PyObject *Small_sum_at(Small *self, PyObject *args)
{
    unsigned long long address;
    Py_ssize_t nbytes;
    int kind;
    op_t *op;
    if (!PyArg_ParseTuple(args, "Kni", &address, &nbytes, &kind) || gone(self))
        return NULL;
    if (self->count || self->busy || kind <= K_BYTES || kind >= N_KINDS || nbytes <= 0 ||
        nbytes > self->limits[OP_ALL_REDUCE] || nbytes > self->slot_bytes)
        return PyLong_FromLong(-1);
    op = &self->queue[self->head];
    memset(op, 0, sizeof(*op));
    op->op = OP_ALL_REDUCE;
    op->kind = kind;
    op->redop = R_SUM;
    op->send.buf = op->recv.buf = (void *)(uintptr_t)address; /* no Py_buffer to release */
    op->nbytes = op->post_bytes = op->total = nbytes;
    return spin_head(self, op);
}

/* pending() -> operations started and not finished, after one pass of steps */
static PyObject *Small_pending(Small *self, PyObject *Py_UNUSED(unused))
{
    if (gone(self))
        return NULL;
    if (!self->busy && progress(self) < 0)
        return NULL;
    return PyLong_FromLong(self->count);
}

static PyObject *Small_started(Small *self, void *Py_UNUSED(unused))
{
    return PyLong_FromUnsignedLongLong(self->next - 1);
}

static PyObject *Small_traffic(Small *self, void *Py_UNUSED(unused))
{
    return Py_BuildValue("(KK)", self->read, self->written);
}

static PyObject *Small_handoff(Small *self, void *Py_UNUSED(unused))
{
    return Py_BuildValue("(KK)", self->polled, self->signalled);
}

static PyObject *Small_levels(Small *self, void *Py_UNUSED(unused))
{
    return PyLong_FromLong(self->levels);
}

static PyGetSetDef Small_getset[] = {
    {"handoff", (getter)Small_handoff, NULL,
     "(lines polled, lines written) by this rank's hand-offs so far", NULL},
    {"levels", (getter)Small_levels, NULL,
     "levels of the hand-off's combining tree (0: flat)", NULL},
    {"started", (getter)Small_started, NULL, "operations started so far", NULL},
    {"traffic", (getter)Small_traffic, NULL,
     "(bytes read, bytes written) by this rank's operations so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* kind(array) -> the element kind the channel reduces it as, or -1 */
static PyObject *module_kind(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer view;
    int kind;
    if (PyObject_GetBuffer(arg, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(-1);
    }
    kind = kind_of(view.format, view.itemsize);
    PyBuffer_Release(&view);
    return PyLong_FromLong(kind);
}

/* close(): from now on every call raises (the caller unmaps the segment next). Refused
 * while another thread spins on it. */
static PyObject *Small_close(Small *self, PyObject *Py_UNUSED(unused))
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "another thread waits on this channel");
        return NULL;
    }
    self->closed = 1;
    Py_RETURN_NONE;
}

/* accept(type): the array type the channel takes (numpy.ndarray) */
static PyObject *module_accept(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "accept(type)");
        return NULL;
    }
    Py_INCREF(arg);
    Py_XDECREF((PyObject *)array_type);
    array_type = (PyTypeObject *)arg;
    Py_RETURN_NONE;
}

/* set_mismatch(cls): the exception class a mismatch between ranks raises */
static PyObject *module_set_mismatch(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (!PyType_Check(arg) || !PyType_IsSubtype((PyTypeObject *)arg,
                                                (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "set_mismatch(exception class)");
        return NULL;
    }
    Py_INCREF(arg);
    Py_XSETREF(SmallError, arg);
    Py_RETURN_NONE;
}

/* head_bytes(slots) -> bytes of a region before its data slots */
static PyObject *module_head_bytes(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_ssize_t data_at;
    long slots = PyLong_AsLong(arg);
    if (slots == -1 && PyErr_Occurred())
        return NULL;
    head_layout((int)slots, &data_at);
    return PyLong_FromSsize_t(data_at);
}

static PyMethodDef module_methods[] = {
    {"head_bytes", module_head_bytes, METH_O,
     "head_bytes(slots) -> bytes of a region before its data slots"},
    {"kind", module_kind, METH_O, "kind(array) -> the channel's element kind, or -1"},
    {"set_mismatch", module_set_mismatch, METH_O,
     "set_mismatch(cls): the exception class a mismatch between ranks raises"},
    {"accept", module_accept, METH_O, "accept(type): the array type the channel takes"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Small_methods[] = {
    {"start", (PyCFunction)Small_start, METH_VARARGS,
     "start(operation, send, recv, redop, root[, total[, offset, stride]]) -> seq; "
     "0: not taken; -1: queue full"},
    {"test", (PyCFunction)Small_test, METH_O,
     "test(seq) -> whether operation seq is finished (one pass, no wait)"},
    {"run", (PyCFunction)(void (*)(void))Small_run, METH_FASTCALL,
     "run(operation, send, recv, redop, root) -> 0 done; -1 not taken; seq: running"},
    {"sum_at", (PyCFunction)Small_sum_at, METH_VARARGS,
     "sum_at(address, nbytes, kind) -> as run, for an in-place SUM at an address"},
    {"close", (PyCFunction)Small_close, METH_NOARGS,
     "close(): every later call raises (the segment is about to go)"},
    {"pending", (PyCFunction)Small_pending, METH_NOARGS,
     "pending() -> operations started and not finished, after one pass of steps"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SmallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hpccomm.backends.shm._small.Small",
    .tp_basicsize = sizeof(Small),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The small-collective channel of one shared-memory communicator.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Small_init,
    .tp_dealloc = (destructor)Small_dealloc,
    .tp_methods = Small_methods,
    .tp_getset = Small_getset,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_small",
    .m_doc = "Small collectives through shared memory (see small.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__small(void)
{
    PyObject *m;
    int i;
    if (PyType_Ready(&SmallType) < 0)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    SmallError = PyErr_NewException("hpccomm.backends.shm._small.Mismatch",
                                    PyExc_ValueError, NULL);
    Py_INCREF(&SmallType);
    if (SmallError == NULL || PyModule_AddObject(m, "Small", (PyObject *)&SmallType) < 0 ||
        PyModule_AddObject(m, "Mismatch", SmallError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    for (i = 0; i < N_OPS; i++) {
        char name[32];
        PyOS_snprintf(name, sizeof(name), "%s", OP_NAMES[i]);
        for (char *c = name; *c; c++)
            *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
        PyModule_AddIntConstant(m, name, i);
    }
    PyModule_AddIntConstant(m, "POSTED_AT", POSTED_AT);
    PyModule_AddIntConstant(m, "HEADERS_AT", HEADERS_AT);
    PyModule_AddIntConstant(m, "HEADER_BYTES", HEADER_BYTES);
    PyModule_AddIntConstant(m, "QUEUE", QUEUE);
    PyModule_AddIntConstant(m, "BYTES", K_BYTES);
    return m;
}
