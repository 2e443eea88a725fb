/*
 * The record walk of log compaction's two passes (storage/compaction.py), in C.
 *
 * Why native: a cleaning walks every record of a partition's dirty part twice, and in Python
 * (a RawRecord per record, varints decoded byte by byte) that is 7-9 s of CPU per GiB of 1 KiB
 * records. On two cores that work, whatever its scheduling class, doubles the producers' p99
 * while it runs (docs/benchmarks.md, "Compaction under load"). Here a record costs a few
 * varint reads and, for its key, one bytes object and one dict operation.
 *
 * Both functions take the records section of one batch, uncompressed (`body`), its record
 * count and base offset, the offset map `latest` (key digest -> offset, a dict) and `digest`,
 * the Python function that turns a key longer than 16 bytes into its digest (shorter keys are
 * their own digest, as compaction.key_digest has it).
 *
 * remember(body, count, base, latest, digest, max_keys) -> bool
 *     Pass 1: map every keyed record's digest to its offset. If the map holds keys already and
 *     this batch's new keys would take it over max_keys, nothing is added and False returned.
 * survivors(body, count, base, latest, digest, expired) -> (list, bool)
 *     Pass 2: the records that stay, as (start, end, offset_delta, timestamp_delta,
 *     after_timestamp) with start/end their bytes in `body` (length prefix excluded) and
 *     after_timestamp where their offset delta starts, relative to start; and whether a kept
 *     one is a tombstone. A record goes if it has no key, if the map has a later offset for
 *     its key, or if it is a tombstone and `expired` is true.
 * keyless(body, count) -> list
 *     The indexes of the records without a key (a produce to a compacted topic refuses them:
 *     this runs on the broker's event loop, for every batch such a topic is sent).
 *
 * Malformed input raises ValueError and never reads outside `body`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../kafka_varint.h"

#define SHORT_KEY 16

typedef struct {
    Py_ssize_t start, end, key_at;
    int64_t ts_delta, off_delta, key_len; /* key_len -1: no key */
    Py_ssize_t after_ts;
    int has_value;
} rec_t;

/* The record at *pos, which moves past it; -1 with ValueError set if it is malformed. */
static int next_record(const uint8_t *buf, Py_ssize_t len, Py_ssize_t *pos, rec_t *r) {
    int ok = 1;
    const uint8_t *p = buf + *pos, *end = buf + len;
    int64_t length = varlong(&p, end, &ok);
    if (!ok || length < 1 || length > end - p) {
        PyErr_SetString(PyExc_ValueError, "record runs past its batch");
        return -1;
    }
    const uint8_t *rs = p, *re = p + length;
    p = rs + 1; /* attributes */
    r->ts_delta = varlong(&p, re, &ok);
    r->after_ts = p - rs;
    r->off_delta = varlong(&p, re, &ok);
    int64_t klen = varlong(&p, re, &ok);
    if (!ok || klen > re - p) {
        PyErr_SetString(PyExc_ValueError, "record's key runs past the record");
        return -1;
    }
    r->key_len = klen < 0 ? -1 : klen;
    r->key_at = p - buf;
    if (klen > 0)
        p += klen;
    int64_t vlen = varlong(&p, re, &ok);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "record's value length runs past the record");
        return -1;
    }
    r->has_value = vlen >= 0;
    r->start = rs - buf;
    r->end = re - buf;
    *pos = r->end;
    return 0;
}

/* The map's key for the record's key (a new reference), or NULL with an error set. */
static PyObject *digest_of(const uint8_t *buf, const rec_t *r, PyObject *digest) {
    PyObject *key = PyBytes_FromStringAndSize((const char *)buf + r->key_at, r->key_len);
    if (key == NULL || r->key_len <= SHORT_KEY)
        return key;
    PyObject *d = PyObject_CallOneArg(digest, key);
    Py_DECREF(key);
    return d;
}

static int at_end(Py_ssize_t pos, Py_ssize_t len) {
    if (pos != len) {
        PyErr_SetString(PyExc_ValueError, "batch has bytes after its last record");
        return 0;
    }
    return 1;
}

/* Every keyed record of the batch as (digest, offset) pairs in `out` (a list). */
static int collect(const uint8_t *buf, Py_ssize_t len, Py_ssize_t count, int64_t base,
                   PyObject *digest, PyObject *out) {
    Py_ssize_t pos = 0;
    rec_t r;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (next_record(buf, len, &pos, &r) < 0)
            return -1;
        if (r.key_len < 0)
            continue;
        PyObject *k = digest_of(buf, &r, digest);
        if (k == NULL)
            return -1;
        PyObject *off = PyLong_FromLongLong((long long)((uint64_t)base + (uint64_t)r.off_delta));
        if (off == NULL) {
            Py_DECREF(k);
            return -1;
        }
        PyObject *pair = PyTuple_Pack(2, k, off);
        Py_DECREF(k);
        Py_DECREF(off);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            return -1;
        }
        Py_DECREF(pair);
    }
    return at_end(pos, len) ? 0 : -1;
}

static PyObject *remember(PyObject *self, PyObject *args) {
    Py_buffer body;
    Py_ssize_t count, max_keys;
    long long base;
    PyObject *latest, *digest;
    if (!PyArg_ParseTuple(args, "y*nLO!On", &body, &count, &base, &PyDict_Type, &latest,
                          &digest, &max_keys))
        return NULL;
    PyObject *pairs = PyList_New(0), *result = NULL, *fresh = NULL;
    if (pairs == NULL)
        goto done;
    if (collect(body.buf, body.len, count, base, digest, pairs) < 0)
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(pairs), held = PyDict_GET_SIZE(latest);
    if (held > 0 && held + count > max_keys) {
        /* Would the batch's new keys overfill the map? (Distinct keys not in it yet.) */
        fresh = PySet_New(NULL);
        if (fresh == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *k = PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, i), 0);
            int has = PyDict_Contains(latest, k);
            if (has < 0 || (!has && PySet_Add(fresh, k) < 0))
                goto done;
        }
        if (held + PySet_GET_SIZE(fresh) > max_keys) {
            result = Py_NewRef(Py_False);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (PyDict_SetItem(latest, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) < 0)
            goto done;
    }
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(fresh);
    Py_XDECREF(pairs);
    PyBuffer_Release(&body);
    return result;
}

static PyObject *survivors(PyObject *self, PyObject *args) {
    Py_buffer body;
    Py_ssize_t count;
    long long base;
    PyObject *latest, *digest;
    int expired;
    if (!PyArg_ParseTuple(args, "y*nLO!Op", &body, &count, &base, &PyDict_Type, &latest,
                          &digest, &expired))
        return NULL;
    const uint8_t *buf = body.buf;
    PyObject *kept = PyList_New(0), *result = NULL;
    int tombstones = 0;
    Py_ssize_t pos = 0;
    rec_t r;
    if (kept == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (next_record(buf, body.len, &pos, &r) < 0)
            goto done;
        if (r.key_len < 0)
            continue;
        int64_t offset = (int64_t)((uint64_t)base + (uint64_t)r.off_delta);
        PyObject *k = digest_of(buf, &r, digest);
        if (k == NULL)
            goto done;
        PyObject *later = PyDict_GetItemWithError(latest, k); /* borrowed */
        Py_DECREF(k);
        if (later == NULL && PyErr_Occurred())
            goto done;
        if (later != NULL) {
            long long at = PyLong_AsLongLong(later);
            if (at == -1 && PyErr_Occurred())
                goto done;
            if (at > offset)
                continue; /* superseded */
        }
        if (!r.has_value) {
            if (expired)
                continue;
            tombstones = 1;
        }
        PyObject *t = Py_BuildValue("(nnLLn)", r.start, r.end, (long long)r.off_delta,
                                    (long long)r.ts_delta, r.after_ts);
        if (t == NULL || PyList_Append(kept, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    if (!at_end(pos, body.len))
        goto done;
    result = Py_BuildValue("(OO)", kept, tombstones ? Py_True : Py_False);
done:
    Py_XDECREF(kept);
    PyBuffer_Release(&body);
    return result;
}

static PyObject *keyless(PyObject *self, PyObject *args) {
    Py_buffer body;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &body, &count))
        return NULL;
    PyObject *out = PyList_New(0), *result = NULL;
    Py_ssize_t pos = 0;
    rec_t r;
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (next_record(body.buf, body.len, &pos, &r) < 0)
            goto done;
        if (r.key_len < 0) {
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(out, at) < 0) {
                Py_XDECREF(at);
                goto done;
            }
            Py_DECREF(at);
        }
    }
    if (at_end(pos, body.len))
        result = Py_NewRef(out);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&body);
    return result;
}

static PyMethodDef methods[] = {
    {"keyless", keyless, METH_VARARGS, "The indexes of the batch's records without a key."},
    {"remember", remember, METH_VARARGS, "Pass 1: map the batch's keys to their offsets."},
    {"survivors", survivors, METH_VARARGS, "Pass 2: the batch's records that stay."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_key_scan", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__key_scan(void) { return PyModule_Create(&module); }
