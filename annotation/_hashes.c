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
 *   Returns n * 24 ASCII hex bytes.
 *   annotation/formats.py wraps it; tests/annotation/test_hashes.py checks it against hashlib.
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

static PyMethodDef METHODS[] = {
    {"hex24", hex24, METH_VARARGS, "24 hex characters of sha256(key || 0x1f || text) per row."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_hashes", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__hashes(void) { return PyModule_Create(&MODULE); }
