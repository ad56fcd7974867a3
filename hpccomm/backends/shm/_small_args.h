/* The small channel's entries, part 2 of _small.c (included by it once, after its types):
 * how a Python call becomes an operation. `describe` takes the buffers, checks what the
 * channel can take (sizes within its limits, element kinds, a reduction it has, the
 * root's and the outputs' buffers), and refuses the rest, which the general path then
 * checks and words as torch does: from `run` (the user's own arguments) it refuses
 * whatever the general path would refuse, so a bad call gets the same error on every
 * rank; from `start` (arguments the general path has already checked) it decides only
 * from what every rank shares, so the ranks never split between two paths. */
#ifndef HPCCOMM_SMALL_ARGS_H
#define HPCCOMM_SMALL_ARGS_H

/* -- describing an operation from Python's arguments ------------------------------------ */

/* numpy.ndarray, set once by accept(): the only type the channel takes from Python */
static PyTypeObject *array_type;

/* Fill op from (operation, send, recv, redop, root), and for a reduce_scatter's piece
 * (stride > 0) where it lies in each of the send buffer's n blocks. Returns 1 when the small path
 * takes it, 0 when it does not (no Python error set), -1 on an error.
 *
 * `raw`: the caller's own arguments (run, before any check), which the channel takes
 * only where the general path would take them too: what it declines meets the general
 * path's checks and errors. Otherwise (start) they passed those checks already, and
 * whether the channel takes them depends only on what every rank of a correct call
 * shares (operation, sizes, element kind, reduction), never on this rank's buffers:
 * a broadcast's root may hand over a read-only buffer (an object's bytes). */
static int describe(Small *self, op_t *op, int code, PyObject *send, PyObject *recv,
                    PyObject *redop, int root, int raw, Py_ssize_t offset,
                    Py_ssize_t stride)
{
    int me = self->rank, n = self->size;
    Py_ssize_t post_bytes = 0, nbytes = 0;
    memset(op, 0, sizeof(*op));
    if (code < 0 || code >= N_OPS || self->limits[code] <= 0 || root < 0 || root >= n)
        return 0;
    op->op = code;
    op->root = code == OP_BROADCAST ? root : 0;
    op->redop = 0;
    if (code == OP_ALL_REDUCE || code == OP_REDUCE_SCATTER) {
        long value;
        /* an int or a RedOpType; never a bool, which the general path refuses */
        if (!PyLong_Check(redop) || PyBool_Check(redop))
            return 0;
        value = PyLong_AsLong(redop);
        if (value < 0 || value >= N_REDOPS) {
            PyErr_Clear();
            return 0;
        }
        op->redop = (int)value;
    }
    /* NumPy arrays only (exact type): anything else is validated by the general path */
    if ((send != Py_None && Py_TYPE(send) != array_type) ||
        (recv != Py_None && Py_TYPE(recv) != array_type))
        return 0;
    if (recv != Py_None) {
        /* writable, as the general path requires of every output, a broadcast's root
         * included; once checked, the root only reads its buffer */
        int flags = (!raw && code == OP_BROADCAST && root == me ? 0 : PyBUF_WRITABLE) |
                    PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(recv, &op->recv, flags) < 0) {
            PyErr_Clear();
            return 0;
        }
        op->has_recv = 1;
    }
    if (send != Py_None) {
        if (send == recv && op->has_recv) {
            op->send = op->recv;
            Py_INCREF(op->send.obj);
        } else if (PyObject_GetBuffer(send, &op->send, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            release(op);
            return 0;
        }
        op->has_send = 1;
    }
    op->kind = K_BYTES;
    if (op->has_send && (op->kind = kind_of(op->send.format, op->send.itemsize)) < 0)
        goto not_here;
    if (op->has_recv && kind_of(op->recv.format, op->recv.itemsize) < 0)
        goto not_here;
    /* one dtype for both buffers, as the general path requires (else it says why) */
    if (raw && op->has_send && op->has_recv && send != recv &&
        (op->send.itemsize != op->recv.itemsize ||
         strcmp(op->send.format ? op->send.format : "B",
                op->recv.format ? op->recv.format : "B") != 0))
        goto not_here;
    switch (code) {
    case OP_BARRIER:
        break;
    case OP_ALL_REDUCE: /* in place: send is recv */
        if (!op->has_send || !op->has_recv || op->send.buf != op->recv.buf ||
            !reducible(op->kind, op->redop))
            goto not_here;
        nbytes = post_bytes = op->recv.len;
        break;
    case OP_BROADCAST: /* the buffer, as send on the root and recv elsewhere */
        if (!op->has_recv)
            goto not_here;
        nbytes = op->recv.len;
        post_bytes = me == root ? nbytes : 0;
        break;
    case OP_ALL_GATHER:
        if (!op->has_send || !op->has_recv || op->recv.len != n * op->send.len)
            goto not_here;
        nbytes = post_bytes = op->send.len;
        break;
    case OP_REDUCE_SCATTER:
        if (!op->has_send || !op->has_recv || !reducible(op->kind, op->redop) ||
            kind_of(op->recv.format, op->recv.itemsize) != op->kind)
            goto not_here;
        if (stride > 0) { /* a piece: len(recv) bytes at offset of each block */
            if (raw || offset < 0 || offset + op->recv.len > stride ||
                op->send.len != n * stride)
                goto not_here;
        } else if (op->send.len != n * op->recv.len) {
            goto not_here;
        } else {
            offset = 0;
            stride = op->recv.len;
        }
        op->offset = offset;
        op->stride = stride;
        nbytes = op->recv.len;
        {   /* its own block is read where it is, unless the output overlaps it (the
             * reduction writes the output as it reads the ranks in order) */
            const char *mine = (const char *)op->send.buf + offset + me * stride;
            const char *out = (const char *)op->recv.buf;
            if (out + nbytes <= mine || mine + nbytes <= out)
                op->mine = mine;
        }
        post_bytes = (op->mine ? n - 1 : n) * nbytes;
        break;
    case OP_ALL_TO_ALL: /* whole elements per rank: the general path refuses the rest */
        if (!op->has_send || !op->has_recv || op->send.len != op->recv.len ||
            op->send.itemsize <= 0 || (op->send.len / op->send.itemsize) % n)
            goto not_here;
        nbytes = op->send.len / n;
        post_bytes = op->send.len;
        break;
    }
    /* a reduce_scatter's slot holds a block per rank, its own too (left unwritten when
     * read in place): what every rank decides alike */
    if ((code == OP_REDUCE_SCATTER ? n * nbytes : post_bytes) > self->slot_bytes ||
        nbytes > self->limits[code] ||
        (code != OP_BARRIER && nbytes == 0))
        goto not_here;
    if (code == OP_BROADCAST && me == root && !op->has_send) { /* the root posts recv */
        op->send = op->recv;
        Py_INCREF(op->send.obj);
        op->has_send = 1;
    }
    op->nbytes = op->total = nbytes;
    op->post_bytes = post_bytes;
    return 1;
not_here:
    release(op);
    return 0;
}

#endif
