/* sha256 of every row of an Arrow string column, without the GIL (annotation/ids.py uses it when
 * built; hashlib otherwise).
 *
 * digests(head_offsets, head_data, head_of_row, offsets, data) -> bytes
 *   Row i's digest is sha256(head[head_of_row[i]] || text[i]): the heads and the texts are given in
 *   Arrow's string layout (int32 offsets, n + 1 of them, into a data buffer). Each head's sha256
 *   state is computed once and copied per row, so a shared prefix (a prompt) is hashed once.
 *   Returns the n 32-byte digests concatenated. Offsets that decrease or point past their data,
 *   and head indices out of range, raise ValueError.
 *
 * Python's hashlib holds the GIL for inputs under 2 KB: per row that is ~1 us of interpreter work
 * around the hashing, on the thread the parser and DuckDB's writer also need.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>
#include <stdint.h>

#define DIGEST 32

static int offsets_valid(const int32_t *off, Py_ssize_t n, Py_ssize_t data_len) {
    if (off[0] < 0) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (off[i + 1] < off[i]) return 0;
    return off[n] <= data_len;
}

static int heads_valid(const int32_t *head_of_row, Py_ssize_t n, Py_ssize_t n_heads) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (head_of_row[i] < 0 || head_of_row[i] >= n_heads) return 0;
    return 1;
}

/* 1 on success, 0 when OpenSSL fails (out of memory). */
static int hash_rows(const int32_t *head_off, const unsigned char *head_data, Py_ssize_t n_heads,
                     const int32_t *head_of_row, const int32_t *off, const unsigned char *data,
                     Py_ssize_t n, unsigned char *out) {
    const EVP_MD *md = EVP_sha256();
    EVP_MD_CTX **heads = PyMem_RawCalloc((size_t)(n_heads ? n_heads : 1), sizeof(EVP_MD_CTX *));
    EVP_MD_CTX *row = EVP_MD_CTX_new();
    int ok = heads != NULL && row != NULL;
    for (Py_ssize_t h = 0; ok && h < n_heads; h++) {
        heads[h] = EVP_MD_CTX_new();
        ok = heads[h] != NULL && EVP_DigestInit_ex(heads[h], md, NULL) &&
             EVP_DigestUpdate(heads[h], head_data + head_off[h], (size_t)(head_off[h + 1] - head_off[h]));
    }
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        ok = EVP_MD_CTX_copy_ex(row, heads[head_of_row[i]]) &&
             EVP_DigestUpdate(row, data + off[i], (size_t)(off[i + 1] - off[i])) &&
             EVP_DigestFinal_ex(row, out + DIGEST * i, NULL);
    }
    for (Py_ssize_t h = 0; heads != NULL && h < n_heads; h++) EVP_MD_CTX_free(heads[h]);
    PyMem_RawFree(heads);
    EVP_MD_CTX_free(row);
    return ok;
}

static PyObject *digests(PyObject *self, PyObject *args) {
    Py_buffer ho, hd, hr, to, td;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*", &ho, &hd, &hr, &to, &td)) return NULL;
    Py_ssize_t n_heads = ho.len / 4 - 1, n = to.len / 4 - 1;
    PyObject *out = NULL;
    if (n_heads < 0 || n < 0 || hr.len != 4 * n) {
        PyErr_SetString(PyExc_ValueError, "digests: need n + 1 offsets per column and n head indices");
    } else if (!offsets_valid(ho.buf, n_heads, hd.len) || !offsets_valid(to.buf, n, td.len) ||
               !heads_valid(hr.buf, n, n_heads)) {
        PyErr_SetString(PyExc_ValueError, "digests: offsets or head indices out of range");
    } else if ((out = PyBytes_FromStringAndSize(NULL, DIGEST * n)) != NULL) {
        int ok;
        Py_BEGIN_ALLOW_THREADS
        ok = hash_rows(ho.buf, hd.buf, n_heads, hr.buf, to.buf, td.buf, n,
                       (unsigned char *)PyBytes_AS_STRING(out));
        Py_END_ALLOW_THREADS
        if (!ok) {
            Py_CLEAR(out);
            PyErr_NoMemory();
        }
    }
    PyBuffer_Release(&ho);
    PyBuffer_Release(&hd);
    PyBuffer_Release(&hr);
    PyBuffer_Release(&to);
    PyBuffer_Release(&td);
    return out;
}

static PyMethodDef methods[] = {
    {"digests", digests, METH_VARARGS, "sha256(head[head_of_row[i]] || text[i]) for every row"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sha256", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sha256(void) { return PyModule_Create(&module); }
