/* The direct form of a synchronous in-place all-reduce: MPI_Iallreduce, then MPI_Test
 * spun in C with the GIL released, for up to a short slice of time.
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

static iallreduce_fn mpi_iallreduce;
static test_fn mpi_test;
static uintptr_t in_place;
static int request_bytes; /* sizeof(MPI_Request) in the library loaded */

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
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "bind(MPI_Iallreduce, MPI_Test, MPI_IN_PLACE, sizeof(MPI_Request))");
        return NULL;
    }
    uintptr_t iallreduce = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[0]);
    uintptr_t test = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[1]);
    uintptr_t place = (uintptr_t)PyLong_AsUnsignedLongLongMask(args[2]);
    long bytes = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (!iallreduce || !test || (bytes != 4 && bytes != 8)) {
        PyErr_SetString(PyExc_ValueError, "bind: null function or unknown MPI_Request size");
        return NULL;
    }
    mpi_iallreduce = (iallreduce_fn)iallreduce;
    mpi_test = (test_fn)test;
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
    unsigned char status[STATUS_BYTES];
    int done = 0, code;
    code = mpi_iallreduce((const void *)in_place, address, (int)count, datatype, op, comm,
                          request);
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

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(iallreduce, test, in_place, request_bytes): the MPI library to call."},
    {"sum_in_place", (PyCFunction)(void (*)(void))sum_in_place, METH_FASTCALL,
     "sum_in_place(address, count, datatype, op, comm, slice, yield_every) -> None or a "
     "request."},
    {"spin_test", (PyCFunction)(void (*)(void))spin_test, METH_FASTCALL,
     "spin_test(address, slice, yield_every) -> whether the request completed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_direct",
    .m_doc = "A synchronous in-place all-reduce started and spun in C (see mpi_direct.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__direct(void) { return PyModule_Create(&module); }
