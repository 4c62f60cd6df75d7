/* Content ids in bulk: the same value as annotation.ids.content_id(key, text) for every row of an
 * Arrow string column, without the GIL.
 *
 * content_id(key, text) = the first 24 hex characters of sha256(key || 0x1f || text). Ingest needs
 * one per response and per judgment; from Python each costs ~2.3 us of interpreter overhead around
 * ~0.4 us of hashing, and holds the GIL that the reader thread and DuckDB's writer share. Here the
 * loop runs in C on OpenSSL's SHA-256 (which uses the CPU's SHA extensions where present), with the
 * GIL released, and the sha256 state of each distinct key is computed once.
 *
 * hex24(key_offsets, key_data, key_of_row, text_offsets, text_data, n) -> bytes
 *   key_offsets/key_data: int32 offsets and bytes of the distinct keys (Arrow string layout);
 *   key_of_row: int32 index of each row's key; text_offsets/text_data: the n texts, likewise.
 *   Returns n * 24 ASCII hex bytes. The buffers must be valid Arrow string buffers (offsets never
 *   decrease): only the last offsets are checked against the data's size.
 *   annotation/ingest/formats.py wraps it; tests/annotation/ingest/test_hashes.py checks it against hashlib.
 */
#define PY_SSIZE_T_CLEAN
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_CTX can be copied; the EVP API's contexts cannot */
#include <Python.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <string.h>

static const char HEX[] = "0123456789abcdef";

static int check_size(Py_buffer *buf, Py_ssize_t needed, const char *name) {
    if (buf->len < needed) {
        PyErr_Format(PyExc_ValueError, "%s: buffer of %zd bytes, need %zd", name, buf->len, needed);
        return -1;
    }
    return 0;
}

static int hash_rows(const int32_t *key_off, const unsigned char *key_data, Py_ssize_t n_keys,
                     const int32_t *key_of_row, const int32_t *text_off,
                     const unsigned char *text_data, Py_ssize_t n, char *out) {
    SHA256_CTX *heads = PyMem_RawMalloc(sizeof(SHA256_CTX) * (n_keys ? n_keys : 1));
    if (heads == NULL) return -1;
    const unsigned char sep = 0x1f;
    for (Py_ssize_t k = 0; k < n_keys; k++) {
        SHA256_Init(&heads[k]);
        SHA256_Update(&heads[k], key_data + key_off[k], (size_t)(key_off[k + 1] - key_off[k]));
        SHA256_Update(&heads[k], &sep, 1);
    }
    unsigned char digest[SHA256_DIGEST_LENGTH];
    for (Py_ssize_t i = 0; i < n; i++) {
        SHA256_CTX ctx = heads[key_of_row[i]];
        SHA256_Update(&ctx, text_data + text_off[i], (size_t)(text_off[i + 1] - text_off[i]));
        SHA256_Final(digest, &ctx);
        for (int j = 0; j < 12; j++) {
            out[24 * i + 2 * j] = HEX[digest[j] >> 4];
            out[24 * i + 2 * j + 1] = HEX[digest[j] & 15];
        }
    }
    PyMem_RawFree(heads);
    return 0;
}

static int key_indices_valid(const int32_t *key_of_row, Py_ssize_t n, Py_ssize_t n_keys) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (key_of_row[i] < 0 || key_of_row[i] >= n_keys) return 0;
    return 1;
}

static PyObject *hex24(PyObject *self, PyObject *args) {
    Py_buffer ko, kd, kr, to, td;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*n", &ko, &kd, &kr, &to, &td, &n)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n_keys = ko.len / 4 - 1;
    const int32_t *key_off = ko.buf, *key_of_row = kr.buf;
    const int32_t *text_off = to.buf;
    if (n < 0 || n_keys < 0 || check_size(&kr, 4 * n, "key_of_row") < 0
        || check_size(&to, 4 * (n + 1), "text_offsets") < 0
        || (n_keys > 0 && check_size(&kd, key_off[n_keys], "key_data") < 0)
        || (n > 0 && check_size(&td, text_off[n], "text_data") < 0)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad sizes");
        goto done;
    }
    if (!key_indices_valid(key_of_row, n, n_keys)) {
        PyErr_SetString(PyExc_ValueError, "key_of_row: an index is out of range");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, 24 * n);
    if (result == NULL) goto done;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = hash_rows(key_off, kd.buf, n_keys, key_of_row, text_off, td.buf, n,
                       PyBytes_AS_STRING(result));
    Py_END_ALLOW_THREADS
    if (failed) {
        Py_CLEAR(result);
        PyErr_NoMemory();
    }
done:
    PyBuffer_Release(&ko);
    PyBuffer_Release(&kd);
    PyBuffer_Release(&kr);
    PyBuffer_Release(&to);
    PyBuffer_Release(&td);
    return result;
}

/* IdSet: the content ids (24 characters each) a batch has written, for first-in-batch flags.
 * Open addressing with linear probing; the table doubles at half load. The ids are sha256 hex, so
 * their bytes mixed by one multiply spread evenly over the table.
 *
 * IdSet().firsts(offsets, data, n) -> bytes: 1 where id i is new (and learns it), else 0. One
 * thread at a time per set: firsts() lets go of the GIL while it changes the table.
 */
#define ID_LEN 24

typedef struct {
    PyObject_HEAD
    char *keys;        /* capacity * ID_LEN bytes */
    unsigned char *used;
    size_t capacity, size;
} IdSet;

static uint64_t id_hash(const char *key) {
    uint64_t a, b, c;
    memcpy(&a, key, 8);
    memcpy(&b, key + 8, 8);
    memcpy(&c, key + 16, 8);
    return (a ^ (b * 0x9E3779B97F4A7C15ULL) ^ (c * 0xC2B2AE3D27D4EB4FULL)) * 0x9E3779B97F4A7C15ULL;
}

/* 1 if added, 0 if present; the table has room (callers grow it first). */
static int id_add(char *keys, unsigned char *used, size_t capacity, const char *key) {
    size_t i = (size_t)(id_hash(key) >> 20) & (capacity - 1);
    while (used[i]) {
        if (memcmp(keys + i * ID_LEN, key, ID_LEN) == 0) return 0;
        i = (i + 1) & (capacity - 1);
    }
    used[i] = 1;
    memcpy(keys + i * ID_LEN, key, ID_LEN);
    return 1;
}

static int id_reserve(IdSet *set, size_t more) {
    size_t capacity = set->capacity ? set->capacity : 1024;
    while (2 * (set->size + more) > capacity) capacity *= 2;
    if (capacity == set->capacity) return 0;
    char *keys = PyMem_RawMalloc(capacity * ID_LEN);
    unsigned char *used = PyMem_RawCalloc(capacity, 1);
    if (keys == NULL || used == NULL) {
        PyMem_RawFree(keys);
        PyMem_RawFree(used);
        return -1;
    }
    for (size_t i = 0; i < set->capacity; i++)
        if (set->used[i]) id_add(keys, used, capacity, set->keys + i * ID_LEN);
    PyMem_RawFree(set->keys);
    PyMem_RawFree(set->used);
    set->capacity = capacity;
    set->keys = keys;
    set->used = used;
    return 0;
}

static PyObject *idset_firsts(IdSet *self, PyObject *args) {
    Py_buffer off_buf, data_buf;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*n", &off_buf, &data_buf, &n)) return NULL;
    PyObject *result = NULL;
    const int32_t *off = off_buf.buf;
    if (n < 0 || check_size(&off_buf, 4 * (n + 1), "offsets") < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (off[i + 1] - off[i] != ID_LEN || off[i] < 0 || off[i + 1] > data_buf.len) {
            PyErr_Format(PyExc_ValueError, "id %zd is not %d characters", i, ID_LEN);
            goto done;
        }
    }
    if (id_reserve(self, (size_t)n) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, n);
    if (result == NULL) goto done;
    char *out = PyBytes_AS_STRING(result);
    const char *data = data_buf.buf;
    size_t added = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = (char)id_add(self->keys, self->used, self->capacity, data + off[i]);
        added += (size_t)out[i];
    }
    Py_END_ALLOW_THREADS
    self->size += added;
done:
    PyBuffer_Release(&off_buf);
    PyBuffer_Release(&data_buf);
    return result;
}

static Py_ssize_t idset_len(IdSet *self) { return (Py_ssize_t)self->size; }

static void idset_dealloc(IdSet *self) {
    PyMem_RawFree(self->keys);
    PyMem_RawFree(self->used);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef IDSET_METHODS[] = {
    {"firsts", (PyCFunction)idset_firsts, METH_VARARGS,
     "firsts(offsets, data, n) -> bytes: 1 where the id is new to the set (which learns it)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods IDSET_SEQUENCE = {.sq_length = (lenfunc)idset_len};

static PyTypeObject IDSET_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "annotation._hashes.IdSet",
    .tp_basicsize = sizeof(IdSet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Set of 24-character content ids; firsts() flags the new ones.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)idset_dealloc,
    .tp_methods = IDSET_METHODS,
    .tp_as_sequence = &IDSET_SEQUENCE,
};

static PyMethodDef METHODS[] = {
    {"hex24", hex24, METH_VARARGS, "24 hex characters of sha256(key || 0x1f || text) per row."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_hashes", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__hashes(void) {
    if (PyType_Ready(&IDSET_TYPE) < 0) return NULL;
    PyObject *module = PyModule_Create(&MODULE);
    if (module == NULL) return NULL;
    Py_INCREF(&IDSET_TYPE);
    if (PyModule_AddObject(module, "IdSet", (PyObject *)&IDSET_TYPE) < 0) {
        Py_DECREF(&IDSET_TYPE);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
