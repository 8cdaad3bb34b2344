/*
 * capi.i — the SWIG module co2.capi: the C API of co2.h, one Python function per C function.
 *
 * The idiomatic layer (co2.Communicator, co2.Engine, co2.torch) is plain Python on top of this
 * module; use that. What this module guarantees:
 *  - Every failing status becomes a Python exception built by the factory that co2/_errors.py
 *    installs (a co2.Error subclass carrying the status and co2_last_error_message()).
 *  - Outputs come back as return values (handles, integers, tuples); functions without outputs
 *    return None.
 *  - The GIL is released around every C call (swig -threads), so ranks that are Python threads
 *    of one process can block in collectives without deadlocking each other. The checkpoint
 *    helpers release it themselves and take it back only to call the caller's file object.
 *  - Data arguments are either numpy arrays, passed by pointer (numpy.i; C-contiguous, aligned,
 *    writeable, native byte order, a supported dtype: anything else raises TypeError, nothing
 *    is ever copied), or raw addresses (`*_address` functions, for torch tensors and device
 *    memory, checked by the caller).
 */
%module(package="co2", docstring="Low-level SWIG wrapper of co2.h. Use the co2 package instead.") capi

%{
#define SWIG_FILE_WITH_INIT
#include <co2/co2.h>
#include <stdint.h>
#include <string.h>
%}

%include "stdint.i"
%include "numpy.i"
%init %{
import_array();
%}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                       */
/* ------------------------------------------------------------------------------------------ */

%{
/* Set by co2/_errors.py: factory(status, function, status_string, detail) -> exception. */
static PyObject *co2_error_factory = NULL;

/* Raises the exception for `status`; reads the thread-local detail first (it is only valid until
 * the next co2 call on this thread). Needs the GIL. */
static void co2_raise_with(co2_status_t status, const char *function, const char *detail);

static void co2_raise(co2_status_t status, const char *function) {
    co2_raise_with(status, function, co2_last_error_message());
}

/* The exception for `status` with a detail of the binding's own. */
static void co2_raise_with(co2_status_t status, const char *function, const char *detail) {
    PyObject *exc;
    if (co2_error_factory == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s failed: %s (status %d): %s", function,
                     co2_status_string(status), (int)status, detail);
        return;
    }
    exc = PyObject_CallFunction(co2_error_factory, "isss", (int)status, function,
                                co2_status_string(status), detail);
    if (exc == NULL) return; /* the factory's own error stands */
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
}
%}

%typemap(out) co2_status_t {
    if ($1 != CO2_OK) {
        co2_raise($1, "$symname");
        SWIG_fail;
    }
    $result = SWIG_Py_Void();
}

%feature("nothread") _set_error_factory;
%inline %{
PyObject *_set_error_factory(PyObject *factory) {
    if (!PyCallable_Check(factory)) {
        PyErr_SetString(PyExc_TypeError, "the error factory must be callable");
        return NULL;
    }
    Py_XDECREF(co2_error_factory);
    Py_INCREF(factory);
    co2_error_factory = factory;
    Py_RETURN_NONE;
}
%}

/* ------------------------------------------------------------------------------------------ */
/* Outputs                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* The status typemap fails before any argout runs, so outputs are returned only on success. */
%define CO2_HANDLE_OUTPUT(TYPE, STRUCT)
%typemap(in, numinputs=0) TYPE *OUTPUT_HANDLE (TYPE temp = NULL) { $1 = &temp; }
%typemap(argout) TYPE *OUTPUT_HANDLE {
    $result = SWIG_Python_AppendOutput($result,
        SWIG_NewPointerObj(SWIG_as_voidptr(*$1), $descriptor(STRUCT *), 0));
}
%enddef
CO2_HANDLE_OUTPUT(co2_comm_t, struct co2_comm)
CO2_HANDLE_OUTPUT(co2_engine_t, struct co2_engine)
CO2_HANDLE_OUTPUT(co2_request_t, struct co2_request)
%apply co2_comm_t *OUTPUT_HANDLE { co2_comm_t *out_comm };
/* co2_comm_split_nodes: returned as [intra_node, inter_node]. */
%apply co2_comm_t *OUTPUT_HANDLE { co2_comm_t *intra_node, co2_comm_t *inter_node };
%apply co2_engine_t *OUTPUT_HANDLE { co2_engine_t *out_engine };
%apply co2_request_t *OUTPUT_HANDLE { co2_request_t *out_request };

%include "typemaps.i"
%apply int *OUTPUT { int *major, int *minor, int *patch, int *out_done, int *out_boundary };
%apply int32_t *OUTPUT { int32_t *out_rank, int32_t *out_size };
%apply size_t *OUTPUT { size_t *out_count, size_t *out_bytes };
%apply double *OUTPUT { double *out_value };

/* Stats: returned as a co2_engine_stats_t object (co2.Engine.stats() turns it into a dict). */
%typemap(in, numinputs=0) co2_engine_stats_t *out_stats (co2_engine_stats_t temp) {
    co2_engine_stats_t init = CO2_ENGINE_STATS_INIT;
    temp = init;
    $1 = &temp;
}
%typemap(argout) co2_engine_stats_t *out_stats {
    co2_engine_stats_t *copy = (co2_engine_stats_t *)malloc(sizeof *copy);
    if (copy == NULL) { PyErr_NoMemory(); SWIG_fail; }
    *copy = *$1;
    $result = SWIG_Python_AppendOutput($result,
        SWIG_NewPointerObj(SWIG_as_voidptr(copy), $descriptor(co2_engine_stats_t *), SWIG_POINTER_OWN));
}

/* ------------------------------------------------------------------------------------------ */
/* Data arguments                                                                               */
/* ------------------------------------------------------------------------------------------ */

%fragment("co2_arrays", "header", fragment="NumPy_Fragments") {
/* Checks that `input` is a numpy array co2 may read and write in place, without a copy.
 * `want` is a co2 dtype, or -1 for any supported one. Sets TypeError and returns NULL if not. */
static PyArrayObject *co2_inplace_array(PyObject *input, int want, const char *what) {
    PyArrayObject *array;
    int typenum;
    if (!is_array(input)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a numpy array, got %s", what,
                     Py_TYPE(input)->tp_name);
        return NULL;
    }
    array = (PyArrayObject *)input;
    typenum = PyArray_TYPE(array);
    if (want == CO2_DTYPE_FP32 ? typenum != NPY_FLOAT32
                               : (typenum != NPY_FLOAT32 && typenum != NPY_FLOAT64 &&
                                  typenum != NPY_INT32 && typenum != NPY_INT64)) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype %s, got %s (co2 never converts: "
                     "convert it yourself and pass the converted array)", what,
                     want == CO2_DTYPE_FP32 ? "float32" : "float32, float64, int32 or int64",
                     typecode_string(typenum));
        return NULL;
    }
    if (!PyArray_IS_C_CONTIGUOUS(array)) {
        PyErr_Format(PyExc_TypeError, "%s: the array is not C-contiguous (co2 never copies: "
                     "pass numpy.ascontiguousarray(a) and keep that array)", what);
        return NULL;
    }
    if (!PyArray_ISALIGNED(array) || !PyArray_ISNOTSWAPPED(array)) {
        PyErr_Format(PyExc_TypeError, "%s: the array must be aligned and in native byte order",
                     what);
        return NULL;
    }
    if (!PyArray_ISWRITEABLE(array)) {
        PyErr_Format(PyExc_TypeError, "%s: the array is read-only; co2 writes into it", what);
        return NULL;
    }
    if (PyArray_SIZE(array) < 1) {
        PyErr_Format(PyExc_ValueError, "%s: the array is empty", what);
        return NULL;
    }
    return array;
}

static co2_dtype_t co2_dtype_of(PyArrayObject *array) {
    switch (PyArray_TYPE(array)) {
    case NPY_FLOAT64: return CO2_DTYPE_FP64;
    case NPY_INT32: return CO2_DTYPE_INT32;
    case NPY_INT64: return CO2_DTYPE_INT64;
    default: return CO2_DTYPE_FP32;
    }
}

/* A Python int (an address) or None. */
static int co2_address(PyObject *input, void **out, const char *what) {
    if (input == Py_None) { *out = NULL; return 1; }
    if (!PyLong_Check(input)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an address (int) or None, got %s", what,
                     Py_TYPE(input)->tp_name);
        return 0;
    }
    *out = PyLong_AsVoidPtr(input);
    return PyErr_Occurred() == NULL;
}
}

/* Any supported dtype, in place: raw collectives. */
%typemap(in, fragment="co2_arrays") (void *ARRAY, size_t COUNT, co2_dtype_t DTYPE) {
    PyArrayObject *array = co2_inplace_array($input, -1, "$symname");
    if (array == NULL) SWIG_fail;
    $1 = PyArray_DATA(array);
    $2 = (size_t)PyArray_SIZE(array);
    $3 = co2_dtype_of(array);
}
/* fp32, in place. */
%typemap(in, fragment="co2_arrays") (float *FP32_ARRAY, size_t COUNT) {
    PyArrayObject *array = co2_inplace_array($input, CO2_DTYPE_FP32, "$symname");
    if (array == NULL) SWIG_fail;
    $1 = (float *)PyArray_DATA(array);
    $2 = (size_t)PyArray_SIZE(array);
}
/* Addresses: an int or None. */
%typemap(in, fragment="co2_arrays") void *ADDRESS {
    if (!co2_address($input, &$1, "$symname")) SWIG_fail;
}
%apply void *ADDRESS { void *stream, void *data, void *address };
%typemap(in, fragment="co2_arrays") float *out { /* consensus_address */
    void *p;
    if (!co2_address($input, &p, "$symname")) SWIG_fail;
    $1 = (float *)p;
}

/* Gradients: a sequence whose items are float32 numpy arrays, addresses (int) or None. The
 * pointer array lives until the call returns; the caller keeps the items alive. */
%typemap(in, fragment="co2_arrays") (void *const *grads, size_t num_grads) (void **pointers = NULL) {
    Py_ssize_t i, n;
    PyObject *seq = PySequence_Fast($input, "$symname: gradients must be a sequence");
    if (seq == NULL) SWIG_fail;
    n = PySequence_Fast_GET_SIZE(seq);
    pointers = (void **)calloc(n > 0 ? (size_t)n : 1, sizeof(void *));
    if (pointers == NULL) { Py_DECREF(seq); PyErr_NoMemory(); SWIG_fail; }
    for (i = 0; i < n; ++i) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (is_array(item)) {
            PyArrayObject *array = co2_inplace_array(item, CO2_DTYPE_FP32, "$symname (gradient)");
            if (array == NULL) { Py_DECREF(seq); SWIG_fail; }
            pointers[i] = PyArray_DATA(array);
        } else if (!co2_address(item, &pointers[i], "$symname (gradient)")) {
            Py_DECREF(seq);
            SWIG_fail;
        }
    }
    Py_DECREF(seq);
    $1 = pointers;
    $2 = (size_t)n;
}
%typemap(freearg) (void *const *grads, size_t num_grads) { free(pointers$argnum); }

/* Unique ids: bytes of exactly CO2_UNIQUE_ID_BYTES, as get_unique_id returns them. */
%typemap(in) const co2_unique_id_t *ID (co2_unique_id_t temp) {
    char *bytes;
    Py_ssize_t length;
    if (!PyBytes_Check($input)) {
        PyErr_Format(PyExc_TypeError, "$symname: the unique id must be bytes, got %s",
                     Py_TYPE($input)->tp_name);
        SWIG_fail;
    }
    if (PyBytes_AsStringAndSize($input, &bytes, &length) < 0) SWIG_fail;
    if (length != (Py_ssize_t)sizeof temp.internal) {
        PyErr_Format(PyExc_ValueError, "$symname: the unique id must be %d bytes long (from "
                     "get_unique_id), got %zd", (int)sizeof temp.internal, length);
        SWIG_fail;
    }
    memcpy(temp.internal, bytes, sizeof temp.internal);
    $1 = &temp;
}

/* ------------------------------------------------------------------------------------------ */
/* Structs: constructed with the C API's defaults                                               */
/* ------------------------------------------------------------------------------------------ */

/* size and version are the ABI's business; group_name is passed to comm_create separately
 * (a char * member would need an owner). */
%immutable co2_comm_config::size;
%immutable co2_comm_config::version;
%ignore co2_comm_config::group_name;
%ignore co2_comm_config::reserved0;
%ignore co2_comm_config::reserved1;
%ignore co2_comm_config::reserved2;
%ignore co2_comm_config::reserved3;
%ignore co2_comm_config::reserved4;
%immutable co2_engine_config::size;
%immutable co2_engine_config::version;
%ignore co2_engine_config::reserved0;
%extend co2_comm_config { co2_comm_config() {
    co2_comm_config_t *c = (co2_comm_config_t *)malloc(sizeof *c);
    if (c != NULL) co2_comm_config_init(c);
    return c;
} }
%extend co2_engine_config { co2_engine_config() {
    co2_engine_config_t *c = (co2_engine_config_t *)malloc(sizeof *c);
    if (c != NULL) co2_engine_config_init(c);
    return c;
} }
%extend co2_engine_stats { co2_engine_stats() {
    co2_engine_stats_t *s = (co2_engine_stats_t *)malloc(sizeof *s);
    co2_engine_stats_t init = CO2_ENGINE_STATS_INIT;
    if (s != NULL) *s = init;
    return s;
} }

/* Replaced by the helpers below (structs with strings or pointers, callbacks). */
%ignore co2_tensor;
%ignore co2_segment;
%ignore co2_unique_id;
%ignore co2_get_unique_id;
%ignore co2_comm_config_init;
%ignore co2_engine_config_init;
%ignore co2_comm_create;
%ignore co2_comm_create_with_id;
%ignore co2_engine_register_tensor;
%ignore co2_engine_add_segment;
%ignore co2_engine_save;
%ignore co2_engine_load;
%ignore co2_engine_save_portable;
/* Runtime-owned storage is for C users: a Python view of it would dangle once the engine is
 * destroyed. Python adopts storage it owns (co2_engine_adopt_flat). */
%ignore co2_engine_alloc_flat;
%ignore co2_write_fn;
%ignore co2_read_fn;

/* Raw collectives: numpy forms; the address forms are helpers below. */
%apply (void *ARRAY, size_t COUNT, co2_dtype_t DTYPE) { (void *buffer, size_t count, co2_dtype_t dtype) };
%apply (float *FP32_ARRAY, size_t COUNT) { (float *out, size_t count) };

%rename("%(strip:[co2_])s") "";
%include "co2/co2.h"
%clear (void *buffer, size_t count, co2_dtype_t dtype);
%clear (float *out, size_t count);

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                      */
/* ------------------------------------------------------------------------------------------ */

%inline %{
/* co2_comm_create with the group name beside the config. */
co2_status_t comm_create(const co2_comm_config_t *config, const char *group_name,
                         co2_comm_t *out_comm) {
    co2_comm_config_t c = *config;
    c.group_name = group_name;
    return co2_comm_create(&c, out_comm);
}

co2_status_t comm_create_with_id(const co2_comm_config_t *config, const char *group_name,
                                 const co2_unique_id_t *ID, int32_t rank, int32_t world_size,
                                 co2_comm_t *out_comm) {
    co2_comm_config_t c = *config;
    c.group_name = group_name;
    return co2_comm_create_with_id(&c, ID, rank, world_size, out_comm);
}

co2_status_t allreduce_address(co2_comm_t comm, void *address, size_t count, co2_dtype_t dtype,
                               co2_reduce_op_t op, void *stream, co2_request_t *out_request) {
    return co2_allreduce(comm, address, count, dtype, op, stream, out_request);
}

co2_status_t broadcast_address(co2_comm_t comm, void *address, size_t count, co2_dtype_t dtype,
                               int32_t root, void *stream, co2_request_t *out_request) {
    return co2_broadcast(comm, address, count, dtype, root, stream, out_request);
}

/* co2_engine_register_tensor for memory the caller describes (torch tensors, device memory). */
co2_status_t engine_register_address(co2_engine_t engine, const char *name, void *address,
                                     size_t count, co2_dtype_t dtype, co2_device_kind_t device,
                                     int32_t device_index, co2_tensor_role_t role) {
    co2_tensor_t t = CO2_TENSOR_INIT;
    t.name = name;
    t.data = address;
    t.count = count;
    t.dtype = dtype;
    t.device = device;
    t.device_index = device_index;
    t.role = role;
    return co2_engine_register_tensor(engine, &t);
}

co2_status_t engine_adopt_flat_address(co2_engine_t engine, void *address, size_t count,
                                       co2_dtype_t dtype, co2_device_kind_t device,
                                       int32_t device_index) {
    return co2_engine_adopt_flat(engine, address, count, dtype, device, device_index);
}

co2_status_t engine_consensus_address(co2_engine_t engine, co2_consensus_t kind, float *out,
                                      size_t count) {
    return co2_engine_consensus(engine, kind, out, count);
}

co2_status_t engine_add_segment(co2_engine_t engine, const char *name, size_t offset,
                                size_t count, co2_tensor_role_t role) {
    co2_segment_t s = CO2_SEGMENT_INIT;
    s.name = name;
    s.offset = offset;
    s.count = count;
    s.role = role;
    return co2_engine_add_segment(engine, &s);
}
%}

/* numpy forms of register / adopt: fp32 arrays, in place. */
%apply (float *FP32_ARRAY, size_t COUNT) { (float *array, size_t count) };
%inline %{
co2_status_t engine_register_array(co2_engine_t engine, const char *name, float *array,
                                   size_t count, co2_tensor_role_t role) {
    return engine_register_address(engine, name, array, count, CO2_DTYPE_FP32, CO2_DEVICE_HOST,
                                   0, role);
}
co2_status_t engine_adopt_flat_array(co2_engine_t engine, float *array, size_t count) {
    return co2_engine_adopt_flat(engine, array, count, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0);
}
%}
%clear (float *array, size_t count);

/* ------------------------------------------------------------------------------------------ */
/* Unique ids and checkpoints: these manage the GIL themselves                                  */
/* ------------------------------------------------------------------------------------------ */

%feature("nothread") get_unique_id;
%feature("nothread") engine_save_bytes;
%feature("nothread") engine_load_bytes;
%feature("nothread") engine_save_to;
%feature("nothread") engine_load_from;

%{
/* Checkpoint streams. The C library calls these on the thread that called save/load, which has
 * released the GIL; bytes sinks never touch Python, file sinks take the GIL per chunk. */
/* A blob or file that ends before the saved state does: the engine is unchanged. */
#define CO2_TRUNCATED_CHECKPOINT                                                                 \
    "the checkpoint ends before the saved state does (a save that was interrupted, or a copy "  \
    "that is incomplete); the engine is unchanged: load an earlier checkpoint"

typedef struct {
    char *data;
    size_t length, used;
    int short_read; /* the library asked for more than the blob holds */
} co2_memory_stream;

static int co2_memory_write(void *user, const void *data, size_t length) {
    co2_memory_stream *s = (co2_memory_stream *)user;
    if (length > s->length - s->used) return 1; /* more than co2_engine_state_size said */
    memcpy(s->data + s->used, data, length);
    s->used += length;
    return 0;
}

static int co2_memory_read(void *user, void *data, size_t length) {
    co2_memory_stream *s = (co2_memory_stream *)user;
    if (length > s->length - s->used) { s->short_read = 1; return 1; } /* truncated blob */
    memcpy(data, s->data + s->used, length);
    s->used += length;
    return 0;
}

typedef struct {
    PyObject *file;
    PyObject *error_type, *error_value, *error_traceback; /* first Python error, if any */
} co2_file_stream;

static int co2_file_failed(co2_file_stream *s) {
    if (s->error_type == NULL) PyErr_Fetch(&s->error_type, &s->error_value, &s->error_traceback);
    else PyErr_Clear();
    return 1;
}

static int co2_file_write(void *user, const void *data, size_t length) {
    co2_file_stream *s = (co2_file_stream *)user;
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = 0;
    PyObject *view = PyMemoryView_FromMemory((char *)data, (Py_ssize_t)length, PyBUF_READ);
    if (view == NULL) {
        rc = co2_file_failed(s);
    } else {
        PyObject *r = PyObject_CallMethod(s->file, "write", "O", view);
        PyObject *released;
        if (r == NULL) rc = co2_file_failed(s);
        Py_XDECREF(r);
        /* The memory is the library's: a file object that kept the view must not read it. */
        released = PyObject_CallMethod(view, "release", NULL);
        if (released == NULL) rc = co2_file_failed(s);
        Py_XDECREF(released);
        Py_DECREF(view);
    }
    PyGILState_Release(gil);
    return rc;
}

static int co2_file_read(void *user, void *data, size_t length) {
    co2_file_stream *s = (co2_file_stream *)user;
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = 0;
    PyObject *r = PyObject_CallMethod(s->file, "read", "n", (Py_ssize_t)length);
    if (r == NULL) {
        rc = co2_file_failed(s);
    } else {
        Py_buffer view;
        if (PyObject_GetBuffer(r, &view, PyBUF_SIMPLE) < 0) {
            rc = co2_file_failed(s);
        } else {
            if ((size_t)view.len == length) memcpy(data, view.buf, length);
            else rc = 1; /* end of file: a truncated checkpoint */
            PyBuffer_Release(&view);
        }
        Py_DECREF(r);
    }
    PyGILState_Release(gil);
    return rc;
}

/* After a save/load through a file: re-raise the file object's own exception if it had one
 * (chained below nothing: it is the cause), else the co2 error. Returns NULL. */
static PyObject *co2_file_error(co2_file_stream *s, co2_status_t status, const char *function) {
    if (s->error_type != NULL) {
        PyErr_Restore(s->error_type, s->error_value, s->error_traceback);
        return NULL;
    }
    co2_raise(status, function);
    return NULL;
}
%}

%inline %{
/* A fresh group id, as bytes (CO2_UNIQUE_ID_BYTES long). */
PyObject *get_unique_id(void) {
    co2_unique_id_t id;
    co2_status_t status = co2_get_unique_id(&id);
    if (status != CO2_OK) { co2_raise(status, "co2_get_unique_id"); return NULL; }
    return PyBytes_FromStringAndSize(id.internal, sizeof id.internal);
}

/* Collective. Every rank calls it; ranks with keep = 0 pass no writer and get None. portable:
 * co2_engine_save_portable (one blob for any world size), else co2_engine_save (a sharded
 * engine: this rank's shard). */
PyObject *engine_save_bytes(co2_engine_t engine, int keep, int portable) {
    co2_status_t status;
    size_t size = 0;
    PyObject *bytes = NULL;
    co2_memory_stream stream = {NULL, 0, 0, 0};
    if (keep) {
        Py_BEGIN_ALLOW_THREADS
        status = portable ? co2_engine_portable_state_size(engine, &size) : co2_engine_state_size(engine, &size);
        Py_END_ALLOW_THREADS
        if (status != CO2_OK) { co2_raise(status, "co2_engine_state_size"); return NULL; }
        bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (bytes == NULL) return NULL;
        stream.data = PyBytes_AS_STRING(bytes);
        stream.length = size;
    }
    Py_BEGIN_ALLOW_THREADS
    status = (portable ? co2_engine_save_portable : co2_engine_save)(engine, keep ? co2_memory_write : NULL,
                                                                     &stream);
    Py_END_ALLOW_THREADS
    if (status != CO2_OK) {
        Py_XDECREF(bytes);
        co2_raise(status, "co2_engine_save");
        return NULL;
    }
    if (!keep) Py_RETURN_NONE;
    if (stream.used != size) {
        Py_DECREF(bytes);
        PyErr_Format(PyExc_RuntimeError, "co2_engine_save wrote %zu bytes, state_size said %zu",
                     stream.used, size);
        return NULL;
    }
    return bytes;
}

/* Not collective. `blob`: any bytes-like object holding exactly one saved state. */
PyObject *engine_load_bytes(co2_engine_t engine, PyObject *blob) {
    Py_buffer view;
    co2_status_t status;
    co2_memory_stream stream;
    if (PyObject_GetBuffer(blob, &view, PyBUF_SIMPLE) < 0) return NULL;
    stream.data = (char *)view.buf;
    stream.length = (size_t)view.len;
    stream.used = 0;
    stream.short_read = 0;
    Py_BEGIN_ALLOW_THREADS
    status = co2_engine_load(engine, co2_memory_read, &stream);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status == CO2_ERR_CALLBACK && stream.short_read) {
        co2_raise_with(CO2_ERR_CHECKPOINT_CORRUPT, "co2_engine_load", CO2_TRUNCATED_CHECKPOINT);
        return NULL;
    }
    if (status != CO2_OK) { co2_raise(status, "co2_engine_load"); return NULL; }
    if (stream.used != stream.length) {
        PyErr_Format(PyExc_ValueError, "co2_engine_load: %zu bytes follow the saved state (the "
                     "engine was restored; pass exactly one saved state)", stream.length - stream.used);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Collective. Streams the state into file.write(); ranks with file None only take part.
 * portable: as engine_save_bytes. */
PyObject *engine_save_to(co2_engine_t engine, PyObject *file, int portable) {
    co2_file_stream s = {file, NULL, NULL, NULL};
    co2_status_t status;
    const int keep = file != Py_None;
    Py_BEGIN_ALLOW_THREADS
    status = (portable ? co2_engine_save_portable : co2_engine_save)(engine, keep ? co2_file_write : NULL, &s);
    Py_END_ALLOW_THREADS
    if (status != CO2_OK) return co2_file_error(&s, status, "co2_engine_save");
    Py_RETURN_NONE;
}

/* Not collective. Reads one saved state from file.read(). */
PyObject *engine_load_from(co2_engine_t engine, PyObject *file) {
    co2_file_stream s = {file, NULL, NULL, NULL};
    co2_status_t status;
    Py_BEGIN_ALLOW_THREADS
    status = co2_engine_load(engine, co2_file_read, &s);
    Py_END_ALLOW_THREADS
    if (status == CO2_ERR_CALLBACK && s.error_type == NULL) {
        co2_raise_with(CO2_ERR_CHECKPOINT_CORRUPT, "co2_engine_load", CO2_TRUNCATED_CHECKPOINT);
        return NULL;
    }
    if (status != CO2_OK) return co2_file_error(&s, status, "co2_engine_load");
    Py_RETURN_NONE;
}
%}
