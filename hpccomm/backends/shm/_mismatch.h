/* The small channel's comparison of the ranks' calls, part 4 of _small.c (included by it
 * once, after its types): every rank reads the headers of the ranks it reads from and
 * compares them with its own call; a difference raises, naming both calls, and breaks
 * the channel (its ranks stopped at different operations, so nothing later pairs up).
 * The dispatch layer adds the operation, rank and group to the words. */
#ifndef HPCCOMM_MISMATCH_H
#define HPCCOMM_MISMATCH_H

/* Rank r's header disagrees with op: set *bad to r, return 1. */
static int mismatch(Small *self, op_t *op, int *bad)
{
    int r;
    for (r = 0; r < self->size; r++) {
        header_t *h;
        if (r == self->rank || (op->op == OP_BROADCAST && r != op->root))
            continue;
        h = header(self, r, op->seq);
        if (h->seq != op->seq || h->op != op->op || h->nbytes != op->nbytes ||
            h->total != op->total || h->root != op->root ||
            (op->op == OP_ALL_REDUCE || op->op == OP_REDUCE_SCATTER ?
             (h->kind != op->kind || h->redop != op->redop) : 0)) {
            *bad = r;
            return 1;
        }
    }
    return 0;
}

/* A mismatch between ranks (the class set_mismatch names; the dispatch layer words
 * it with the operation, rank and group). */
static PyObject *SmallError;

/* Raise (and return 1) once the channel is closed (its memory may be unmapped), or
 * broken by a mismatch (its ranks stopped at different operations). */
static int gone(Small *self)
{
    if (self->broken != NULL) {
        PyErr_Format(SmallError, "an earlier operation stopped the group's shared-memory "
                     "channel (%U); the group is unusable: destroy it", self->broken);
        return 1;
    }
    if (!self->closed)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "the group's small-collective channel is closed "
                    "(the group was destroyed)");
    return 1;
}

/* "all_reduce of 1048576 bytes (float64, SUM)" or a piece's whole call. */
static PyObject *call_text(int op, int64_t total, int kind, int redop, int root)
{
    const char *name = op >= 0 && op < N_OPS ? OP_NAMES[op] : "an unknown operation";
    const char *kinds = kind >= 0 && kind < N_KINDS ? KIND_NAMES[kind] : "?";
    if (op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER)
        return PyUnicode_FromFormat("%s of %lld bytes (%s, %s)", name, (long long)total,
                                    kinds, redop >= 0 && redop < N_REDOPS ?
                                    REDOP_NAMES[redop] : "?");
    if (op == OP_BROADCAST)
        return PyUnicode_FromFormat("%s of %lld bytes from group rank %d", name,
                                    (long long)total, root);
    if (op == OP_BARRIER)
        return PyUnicode_FromString(name);
    return PyUnicode_FromFormat("%s of %lld bytes per rank (%s)", name, (long long)total,
                                kinds);
}

/* Raise the mismatch of op with rank bad's header, and break the channel: the ranks
 * stopped at different operations, so nothing later can pair up again. */
static void raise_mismatch(Small *self, op_t *op, int bad)
{
    header_t *h = header(self, bad, op->seq);
    PyObject *mine = NULL, *theirs = NULL, *text;
    if (h->seq != op->seq) {
        text = PyUnicode_FromFormat(
            "group rank %d is at another of the group's shared-memory operations (its "
            "#%llu where this rank is at #%llu): a rank skipped a call, or made one the "
            "others did not", bad, (unsigned long long)h->seq,
            (unsigned long long)op->seq);
    } else {
        mine = call_text(op->op, op->total, op->kind, op->redop, op->root);
        theirs = call_text(h->op, h->total, h->kind, h->redop, h->root);
        text = mine && theirs ? PyUnicode_FromFormat(
            "ranks called different collectives: group rank %d called %U, this rank "
            "(group rank %d) called %U", bad, theirs, self->rank, mine) : NULL;
    }
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    if (text == NULL)
        return;
    PyErr_Format(SmallError, "%U; the group is now unusable (its shared-memory channel "
                 "stopped at this operation): destroy it", text);
    if (self->broken == NULL)
        self->broken = text;
    else
        Py_DECREF(text);
}

#endif
