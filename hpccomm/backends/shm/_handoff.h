/* The small channel's hand-off, part 3 of _small.c (included by it once, after its
 * types): how a rank learns that the ranks it waits for have posted an operation, have
 * finished reading the slot it wants to reuse, or (a split all_reduce) have published
 * their reduced parts.
 *
 * Flat (small groups): each rank raises counters in its own region (`posted`, `done`,
 * `reduced`) and a waiting rank reads every other rank's: n - 1 lines per wait, so a
 * node of n ranks moves about 3 n^2 cache lines per operation between its cores.
 *
 * A combining tree (from `HPCCOMM_SHM_TREE` ranks): the ranks are the leaves of a tree
 * of radix k; each tree node has, per counter kind and slot, one counter on its own
 * cache line in the region of its first rank. A rank arriving adds 1 (atomically) to its
 * leaf node's counter; the rank whose add completes a node (its count reaches children
 * x uses of the slot) adds 1 to the parent's, and so on up: whoever comes last carries
 * the arrival up, so no rank ever waits for another to forward (a rank that started an
 * async operation and went away blocks nobody, as in the flat form). Every waiting rank
 * polls one line, the root's counter. Per operation and kind a rank writes 1 to
 * ceil(log_k n) lines and polls 1, and the node moves O(n) lines in all.
 *
 * A slot's counters count its uses: operation `seq` is use (seq - 1) / slots + 1 of
 * slot seq % slots, and a rank posts use u + 1 only once every rank finished use u, so
 * the adds of one use never mix with the next one's. The split all_reduce's `reduced`
 * counts count the slot's split uses, which every rank numbers alike. An add is
 * acquire-release, so the data and headers written before an arrival are visible to a
 * rank that read the completed root counter with acquire order (the release sequence
 * runs through every add of the tree).
 *
 * Both forms count the lines a rank polls and writes for its hand-offs (`handoff`),
 * so a test can check their growth with n.
 */
#ifndef HPCCOMM_HANDOFF_H
#define HPCCOMM_HANDOFF_H

enum { C_ARRIVED, C_DONE, C_REDUCED, N_COUNTERS };

/* Bytes of the tree's counters in each region (every region has room for the nodes
 * its rank may own: one per level). */
static inline Py_ssize_t tree_bytes(int slots)
{
    return (Py_ssize_t)MAX_LEVELS * N_COUNTERS * slots * 64;
}

/* Where the tree's counters start in a region of `slots` slots, after the headers;
 * *data_at: where the data slots start (both on 128-byte boundaries). */
static Py_ssize_t head_layout(int slots, Py_ssize_t *data_at)
{
    Py_ssize_t tree_at = (HEADERS_AT + (Py_ssize_t)slots * HEADER_BYTES + 127) / 128 * 128;
    *data_at = (tree_at + tree_bytes(slots) + 127) / 128 * 128;
    return tree_at;
}

/* Lay out the tree of radix `radix` (0: flat) for this rank: its node and the node's
 * children at every level, up to the root. */
static int tree_layout(Small *self, int radix)
{
    int level, span = 1, nodes = self->size;
    self->radix = radix;
    self->levels = 0;
    if (radix < 2)
        return 0;
    for (level = 0; nodes > 1 || level == 0; level++) {
        int j, first, owner, below = nodes;
        if (level == MAX_LEVELS) {
            PyErr_SetString(PyExc_ValueError, "Small: tree deeper than MAX_LEVELS");
            return -1;
        }
        span *= radix;                       /* ranks under one node of this level */
        nodes = (nodes + radix - 1) / radix; /* nodes at this level */
        j = self->rank / span;
        first = j * radix;                   /* its first child, at the level below */
        self->children[level] = below - first < radix ? below - first : radix;
        owner = j * span;
        self->nodes[level] = self->regions[owner] + self->tree_at +
                             (Py_ssize_t)level * N_COUNTERS * self->slots * 64;
    }
    self->levels = level;
    return 0;
}

static inline uint64_t *counter(Small *self, int level, int kind, uint64_t seq)
{
    return (uint64_t *)(self->nodes[level] +
                        ((Py_ssize_t)kind * self->slots +
                         (Py_ssize_t)(seq % (uint64_t)self->slots)) * 64);
}

/* This rank's arrival at `kind` of use `use` of operation seq's slot: add to its leaf's
 * counter, and carry the arrival up while it completes a node. */
static void arrive(Small *self, int kind, uint64_t seq, uint64_t use)
{
    int level;
    for (level = 0; level < self->levels; level++) {
        uint64_t old = __atomic_fetch_add(counter(self, level, kind, seq), 1,
                                          __ATOMIC_ACQ_REL);
        self->signalled++;
        if (old + 1 != (uint64_t)self->children[level] * use)
            return;
    }
}

/* Whether every rank has arrived at `kind` of use `use` of seq's slot: the root's count. */
static inline int all_arrived(Small *self, int kind, uint64_t seq, uint64_t use)
{
    int root = self->levels - 1;
    return __atomic_load_n(counter(self, root, kind, seq), __ATOMIC_ACQUIRE) >=
           (uint64_t)self->children[root] * use;
}

static inline uint64_t use_of(Small *self, uint64_t seq)
{
    return (seq - 1) / (uint64_t)self->slots + 1;
}

/* -- the three waits and the three signals ---------------------------------------------- */

/* Whether every other rank has raised `kind` for op: on the tree the root's count of
 * use `use`; flat, each rank's own counter at `at` of its region. */
static int others_at(Small *self, op_t *op, int kind, uint64_t use, Py_ssize_t at)
{
    int r;
    if (self->levels) {
        if (!all_arrived(self, kind, op->seq, use))
            return 0;
        self->polled++;
        return 1;
    }
    for (r = 0; r < self->size; r++)
        if (r != self->rank && load(self, r, at) < op->seq)
            return 0;
    self->polled += (unsigned long long)self->size - 1;
    return 1;
}

/* Whether every rank has finished reading the operation that last used op's slot. */
static int slot_free(Small *self, op_t *op)
{
    int r;
    if (op->seq <= (uint64_t)self->slots)
        return 1;
    if (self->levels) {
        if (!all_arrived(self, C_DONE, op->seq, use_of(self, op->seq) - 1))
            return 0;
        self->polled++;
        return 1;
    }
    for (r = 0; r < self->size; r++)
        if (load(self, r, DONE_AT) < op->seq - (uint64_t)self->slots)
            return 0;
    self->polled += (unsigned long long)self->size;
    return 1;
}

/* op's data and header are in this rank's slot. */
static void signal_posted(Small *self, op_t *op)
{
    store(self, POSTED_AT, op->seq); /* a broadcast's readers poll the root's */
    self->signalled++;
    if (self->levels)
        arrive(self, C_ARRIVED, op->seq, use_of(self, op->seq));
}

/* Whether the ranks op reads from have posted it. */
static int arrived(Small *self, op_t *op)
{
    if (op->op == OP_BROADCAST) {
        if (op->root != self->rank && load(self, op->root, POSTED_AT) < op->seq)
            return 0;
        self->polled += op->root != self->rank;
        return 1;
    }
    return others_at(self, op, C_ARRIVED, use_of(self, op->seq), POSTED_AT);
}

/* This rank has read what op needs from the slots. */
static void signal_done(Small *self, op_t *op)
{
    if (self->levels) {
        arrive(self, C_DONE, op->seq, use_of(self, op->seq));
        return;
    }
    store(self, DONE_AT, op->seq);
    self->signalled++;
}

/* This rank's part of the split all_reduce op is reduced and published. */
static void signal_reduced(Small *self, op_t *op)
{
    if (self->levels) {
        arrive(self, C_REDUCED, op->seq, op->split_use);
        return;
    }
    store(self, REDUCED_AT, op->seq);
    self->signalled++;
}

/* Whether every other rank has published its reduced part of op. */
static int parts_reduced(Small *self, op_t *op)
{
    return others_at(self, op, C_REDUCED, op->split_use, REDUCED_AT);
}

#endif
