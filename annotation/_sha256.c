/* Ingest's two loops over every row, in C without the GIL (annotation/ids.py and
 * annotation/ingest/seen.py use them when this is built; hashlib and Python sets otherwise).
 *
 * digests(head_offsets, head_data, head_of_row, offsets, data) -> bytes
 *   Row i's digest is sha256(head[head_of_row[i]] || text[i]): the heads and the texts are given in
 *   Arrow's string layout (int32 offsets, n + 1 of them, into a data buffer). Each head's sha256
 *   state is computed once and copied per row, so a shared prefix (a prompt) is hashed once.
 *   Returns the n 32-byte digests concatenated. Offsets that decrease or point past their data,
 *   and head indices out of range, raise ValueError.
 *
 * first_new(table, offsets, data, out) -> int
 *   The set of content ids a batch has written: `table` is a writable buffer of 2 * cap uint64
 *   words (cap a power of two), slot s holding an id's first 64 bits in word 2s and its last 32 bits
 *   plus 2^32 in word 2s + 1 (0: empty). Each id (24 hex characters, Arrow string layout) not yet in
 *   the table is added and gets out[i] = 1; ids already there, or earlier in the same call, get 0.
 *   Returns how many were added. The caller keeps the table under half full; an id that is not
 *   24 hex characters raises ValueError.
 *
 * Python's hashlib holds the GIL for inputs under 2 KB, and a Python set needs an object per id:
 * per row that is ~1 us of interpreter work, on the thread the parser and DuckDB's writer also need.
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

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* An id's 96 bits as (hi, lo | 2^32); 0 when it is not 24 lowercase hex characters. */
static int id_words(const unsigned char *text, int32_t len, uint64_t *hi, uint64_t *lo) {
    if (len != 24) return 0;
    uint64_t words[2] = {0, 0};
    for (int j = 0; j < 24; j++) {
        int v = hex_value(text[j]);
        if (v < 0) return 0;
        words[j / 16] = (words[j / 16] << 4) | (uint64_t)v;
    }
    *hi = words[0];
    *lo = words[1] | (1ULL << 32);
    return 1;
}

/* The number of ids added; -1 at an id that is not 24 hex characters, -2 when the table is full.
 * Ids go in groups: a group's slots are prefetched before any is probed, so its cache misses overlap
 * (a table of millions of ids is far larger than the cache, and each probe is a miss). */
#define GROUP 16
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 1)
#else
#define PREFETCH(p) ((void)(p))
#endif
static Py_ssize_t add_ids(uint64_t *table, uint64_t mask, const int32_t *off, const unsigned char *data,
                          Py_ssize_t n, unsigned char *out) {
    Py_ssize_t added = 0;
    uint64_t hi[GROUP], lo[GROUP];
    for (Py_ssize_t start = 0; start < n; start += GROUP) {
        Py_ssize_t size = n - start < GROUP ? n - start : GROUP;
        for (Py_ssize_t g = 0; g < size; g++) {
            Py_ssize_t i = start + g;
            if (!id_words(data + off[i], off[i + 1] - off[i], &hi[g], &lo[g])) return -1;
            PREFETCH(&table[2 * (hi[g] & mask)]);
        }
        for (Py_ssize_t g = 0; g < size; g++) {
            uint64_t slot = hi[g] & mask, probes = 0;
            while (table[2 * slot + 1] != 0 && (table[2 * slot] != hi[g] || table[2 * slot + 1] != lo[g])) {
                slot = (slot + 1) & mask;
                if (++probes > mask) return -2;
            }
            unsigned char is_new = table[2 * slot + 1] == 0;
            out[start + g] = is_new;
            if (is_new) {
                table[2 * slot] = hi[g];
                table[2 * slot + 1] = lo[g];
                added++;
            }
        }
    }
    return added;
}

static PyObject *first_new(PyObject *self, PyObject *args) {
    Py_buffer table, to, td, out;
    if (!PyArg_ParseTuple(args, "w*y*y*w*", &table, &to, &td, &out)) return NULL;
    Py_ssize_t cap = table.len / 16, n = to.len / 4 - 1, added = -2;
    if (cap < 1 || (cap & (cap - 1)) != 0 || table.len != 16 * cap || n < 0 || out.len != n) {
        PyErr_SetString(PyExc_ValueError, "first_new: need a table of 2 * 2^k words, n + 1 offsets, n outputs");
    } else if (!offsets_valid(to.buf, n, td.len)) {
        PyErr_SetString(PyExc_ValueError, "first_new: offsets out of range");
    } else {
        Py_BEGIN_ALLOW_THREADS
        added = add_ids(table.buf, (uint64_t)cap - 1, to.buf, td.buf, n, out.buf);
        Py_END_ALLOW_THREADS
        if (added < 0)
            PyErr_SetString(PyExc_ValueError, added == -1 ? "first_new: an id is not 24 hex characters"
                                                          : "first_new: the table is full");
    }
    PyBuffer_Release(&table);
    PyBuffer_Release(&to);
    PyBuffer_Release(&td);
    PyBuffer_Release(&out);
    return added < 0 ? NULL : PyLong_FromSsize_t(added);
}

static PyMethodDef methods[] = {
    {"digests", digests, METH_VARARGS, "sha256(head[head_of_row[i]] || text[i]) for every row"},
    {"first_new", first_new, METH_VARARGS, "add ids to an open-addressing table; 1 where new"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sha256", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sha256(void) { return PyModule_Create(&module); }
