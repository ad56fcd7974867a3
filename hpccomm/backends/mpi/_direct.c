/* The direct forms of a synchronous in-place all-reduce (MPI_Iallreduce) and of a
 * blocking send or receive with a known peer (MPI_Isend, MPI_Irecv): the call, then
 * MPI_Test spun in C with the GIL released, for up to a short slice of time.
 *
 * It exists for the per-call cost, not for bandwidth: the general path spends about
 * 2 us of Python per operation (views, options, a Work), which a torch process group's
 * all_reduce pays on top of torch's own wrapper. Here the caller passes a buffer
 * address, an element count and MPI handles it has resolved once.
 *
 * The MPI functions are the ones mpi4py already loaded (their addresses come from
 * Python, found through ctypes in mpi4py's extension), so this file includes no mpi.h
 * and one build serves MPICH, Open MPI and Intel MPI alike. Handles travel as
 * integers: MPICH numbers them with C ints, Open MPI with pointers; both fit one
 * register argument, and the caller passes each exactly as mpi4py reports it.
 *
 * The spin never outlasts `slice` seconds: an operation still running then is handed
 * back as its request, and the caller waits for it the general way (its deadline, its
 * errors, signals, the progress of other operations). Like the general wait, it yields
 * the core (sched_yield) every `yield_every` tests: where ranks outnumber cores, a rank
 * spinning through its time slice keeps the rank it waits for off the core (measured
 * 4 ranks on 2 cores: 5 ms per 8-byte sum without yields, tens of us with them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_spin.h"

typedef int (*iallreduce_fn)(const void *, void *, int, uintptr_t, uintptr_t, uintptr_t,
                             void *);
typedef int (*test_fn)(void *, int *, void *);
/* MPI_Isend and MPI_Irecv: (buffer, count, datatype, peer, tag, comm, request) */
typedef int (*transfer_fn)(void *, int, uintptr_t, int, int, uintptr_t, void *);

static iallreduce_fn mpi_iallreduce;
static transfer_fn mpi_isend, mpi_irecv;
static test_fn mpi_test;
static uintptr_t in_place;
static int request_bytes; /* sizeof(MPI_Request) in the library loaded */

/* The buffer formats a transfer takes, each with its MPI datatype (set_transfer_types):
 * a NumPy array's format and item size name its dtype, so the caller passes the array
 * alone and the count and datatype are found here. */
#define MAX_TRANSFER_TYPES 32
static struct {
    char format[8];
    Py_ssize_t itemsize;
    uintptr_t datatype;
} transfer_types[MAX_TRANSFER_TYPES];
static int n_transfer_types;

/* A status is at most a few dozen bytes in every MPI library; this is ample. */
#define STATUS_BYTES 256

/* Test `request` until it completes or `slice` seconds pass, yielding the core every
 * `yield_every` tests (0: never); called with the GIL released. Returns MPI's error code
 * (0: *done says whether it completed). */
static int spin(void *request, double slice, long yield_every, int *done)
{
    unsigned char status[STATUS_BYTES];
    spin_t turn = spin_start(slice, yield_every);
    int code;
    while ((code = mpi_test(request, done, status)) == 0 && !*done) {
        if (spin_idle(&turn))
            break;
    }
    return code;
}

/* Raise RuntimeError(code) for an MPI error code; returns NULL. */
static PyObject *mpi_error(int code)
{
    PyObject *number = PyLong_FromLong(code);
    if (number) {
        PyErr_SetObject(PyExc_RuntimeError, number);
        Py_DECREF(number);
    }
    return NULL;
}

static PyObject *bind(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "bind(MPI_Iallreduce, MPI_Test, MPI_IN_PLACE, sizeof(MPI_Request), "
                        "MPI_Isend, MPI_Irecv)");
        return NULL;
    }
    uintptr_t iallreduce = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[0]);
    uintptr_t test = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[1]);
    uintptr_t place = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[2]);
    long bytes = PyLong_AsLong(args[3]);
    uintptr_t isend = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[4]);
    uintptr_t irecv = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (!iallreduce || !test || !isend || !irecv || (bytes != 4 && bytes != 8)) {
        PyErr_SetString(PyExc_ValueError, "bind: null function or unknown MPI_Request size");
        return NULL;
    }
    mpi_iallreduce = (iallreduce_fn)iallreduce;
    mpi_test = (test_fn)test;
    mpi_isend = (transfer_fn)isend;
    mpi_irecv = (transfer_fn)irecv;
    in_place = place;
    request_bytes = (int)bytes;
    Py_RETURN_NONE;
}

/* The request as mpi4py's Request.fromhandle takes it: an unsigned machine word (a C
 * int handle sign-extended first, as mpi4py's own _handleof reports one). */
static PyObject *request_object(const unsigned char *request)
{
    if (request_bytes == 4) {
        int32_t handle;
        memcpy(&handle, request, sizeof handle);
        return PyLong_FromUnsignedLongLong((uint64_t)(int64_t)handle);
    }
    uint64_t handle;
    memcpy(&handle, request, sizeof handle);
    return PyLong_FromUnsignedLongLong(handle);
}

/* What a direct form does once its call returned `code` and (if 0) filled `request`:
 * test it, spin on it with the GIL released for up to `slice` seconds, and return None
 * once it completed, else the request (an int) still running; an MPI error raises
 * RuntimeError(code) (nothing is pending then: a failed start creates no request, a
 * failed test ends it). */
static PyObject *settle(int code, unsigned char *request, double slice, long yield_every)
{
    unsigned char status[STATUS_BYTES];
    int done = 0;
    if (code == 0)
        code = mpi_test(request, &done, status);
    if (code == 0 && !done) {
        Py_BEGIN_ALLOW_THREADS
        code = spin(request, slice, yield_every, &done);
        Py_END_ALLOW_THREADS
    }
    if (code != 0)
        return mpi_error(code);
    if (done)
        Py_RETURN_NONE;
    return request_object(request);
}

/* sum_in_place(address, count, datatype, op, comm, slice, yield_every) -> None when the
 * operation has completed, else its request (an int) if it is still running after
 * `slice` seconds. The spin yields the core every `yield_every` tests (0: never).
 * An MPI error raises RuntimeError(its error code) (nothing is pending then: a failed start
 * creates no request, a failed test ends it). */
static PyObject *sum_in_place(PyObject *Py_UNUSED(self), PyObject *const *args,
                                Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "sum_in_place(address, count, datatype, op, comm, slice, yield_every)");
        return NULL;
    }
    if (!mpi_iallreduce) {
        PyErr_SetString(PyExc_RuntimeError, "sum_in_place: bind() was not called");
        return NULL;
    }
    void *address = (void *)(uintptr_t)PyLong_AsUnsignedLongLongMask(args[0]);
    long long count = PyLong_AsLongLong(args[1]);
    uintptr_t datatype = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[2]);
    uintptr_t op = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[3]);
    uintptr_t comm = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[4]);
    double slice = PyFloat_AsDouble(args[5]);
    long yield_every = PyLong_AsLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (count < 0 || count > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "sum_in_place: count outside MPI's int range");
        return NULL;
    }
    unsigned char request[8] = {0};
    int code = mpi_iallreduce((const void *)in_place, address, (int)count, datatype, op,
                              comm, request);
    return settle(code, request, slice, yield_every);
}

/* spin_test(address, slice, yield_every) -> bool: MPI_Test the request stored at
 * `address` (inside an mpi4py Request: MPI._addressof) with the GIL released until it
 * completes (True; MPI sets the stored handle to MPI_REQUEST_NULL, as mpi4py's own Test
 * does) or `slice` seconds pass (False). Yields the core every `yield_every` tests
 * (0: never). One release of the GIL per wait, where a Python loop of Request.Test
 * releases it per test: a thread waiting for the GIL then gets it at once, instead of
 * being signalled at every test until the interpreter forces a switch (5 ms). */
static PyObject *spin_test(PyObject *Py_UNUSED(self), PyObject *const *args,
                             Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "spin_test(address, slice, yield_every)");
        return NULL;
    }
    if (!mpi_test) {
        PyErr_SetString(PyExc_RuntimeError, "spin_test: bind() was not called");
        return NULL;
    }
    void *request = (void *)(uintptr_t)PyLong_AsUnsignedLongLongMask(args[0]);
    double slice = PyFloat_AsDouble(args[1]);
    long yield_every = PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (!request) {
        PyErr_SetString(PyExc_ValueError, "spin_test: null request address");
        return NULL;
    }
    int done = 0, code;
    Py_BEGIN_ALLOW_THREADS
    code = spin(request, slice, yield_every, &done);
    Py_END_ALLOW_THREADS
    if (code != 0)
        return mpi_error(code);
    return PyBool_FromLong(done);
}

/* set_transfer_types([(format, itemsize, datatype), ...]): the buffer formats transfer
 * takes and the MPI datatype of each; any other buffer is not taken. */
static PyObject *set_transfer_types(PyObject *Py_UNUSED(self), PyObject *arg)
{
    PyObject *items = PySequence_Fast(arg, "set_transfer_types(list of tuples)");
    Py_ssize_t i, n;
    if (items == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(items);
    n_transfer_types = 0;
    for (i = 0; i < n && n_transfer_types < MAX_TRANSFER_TYPES; i++) {
        const char *format;
        Py_ssize_t itemsize;
        unsigned long long datatype;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, i), "snK", &format, &itemsize,
                              &datatype)) {
            Py_DECREF(items);
            return NULL;
        }
        if (strlen(format) >= sizeof(transfer_types[0].format))
            continue;
        strcpy(transfer_types[n_transfer_types].format, format);
        transfer_types[n_transfer_types].itemsize = itemsize;
        transfer_types[n_transfer_types].datatype = (uintptr_t)datatype;
        n_transfer_types++;
    }
    Py_DECREF(items);
    Py_RETURN_NONE;
}

/* transfer(comm, yield_every, receive, array, peer, tag, slice) -> None once done, the
 * request (an int) if still running after `slice` seconds, or False, with nothing
 * started, where `array` does not export a C-contiguous buffer (writable, to receive
 * into) of a format set_transfer_types named: the caller then takes the general path.
 * `receive` false sends the whole buffer to `peer`, true receives into it from `peer`.
 * The caller keeps `array` alive until a returned request completes. An MPI error
 * raises RuntimeError(its error code), as sum_in_place does. */
static PyObject *transfer(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "transfer(comm, yield_every, receive, array, peer, "
                                         "tag, slice)");
        return NULL;
    }
    if (!mpi_isend) {
        PyErr_SetString(PyExc_RuntimeError, "transfer: bind() was not called");
        return NULL;
    }
    /* the communicator and the spin's yields first: the backend binds them once, when
     * it makes the communicator (functools.partial) */
    uintptr_t comm = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[0]);
    long yield_every = PyLong_AsLong(args[1]);
    int receive = PyObject_IsTrue(args[2]);
    long peer = PyLong_AsLong(args[4]);
    long tag = PyLong_AsLong(args[5]);
    double slice = PyFloat_AsDouble(args[6]);
    if (receive < 0 || PyErr_Occurred())
        return NULL;
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (receive ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(args[3], &view, flags)) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    const char *format = view.format ? view.format : "B";
    uintptr_t datatype = 0;
    int i, found = 0;
    for (i = 0; i < n_transfer_types; i++) {
        if (transfer_types[i].itemsize == view.itemsize &&
            strcmp(transfer_types[i].format, format) == 0) {
            datatype = transfer_types[i].datatype;
            found = 1;
            break;
        }
    }
    Py_ssize_t count = view.itemsize > 0 ? view.len / view.itemsize : 0;
    if (!found || count > INT32_MAX) { /* the general path counts in larger types */
        PyBuffer_Release(&view);
        Py_RETURN_FALSE;
    }
    unsigned char request[8] = {0};
    int code = (receive ? mpi_irecv : mpi_isend)(view.buf, (int)count, datatype, (int)peer,
                                                 (int)tag, comm, request);
    PyBuffer_Release(&view); /* the caller keeps the array, and so its memory, alive */
    return settle(code, request, slice, yield_every);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(iallreduce, test, in_place, request_bytes): the MPI library to call."},
    {"sum_in_place", (PyCFunction)(void (*)(void))sum_in_place, METH_FASTCALL,
     "sum_in_place(address, count, datatype, op, comm, slice, yield_every) -> None or a "
     "request."},
    {"spin_test", (PyCFunction)(void (*)(void))spin_test, METH_FASTCALL,
     "spin_test(address, slice, yield_every) -> whether the request completed."},
    {"transfer", (PyCFunction)(void (*)(void))transfer, METH_FASTCALL,
     "transfer(comm, yield_every, receive, array, peer, tag, slice) -> "
     "None, a request, or False (not taken)."},
    {"set_transfer_types", set_transfer_types, METH_O,
     "set_transfer_types([(format, itemsize, datatype), ...]): the buffers transfer takes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_direct",
    .m_doc = "Synchronous all-reduces, sends and receives started and spun in C (see direct.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__direct(void) { return PyModule_Create(&module); }
