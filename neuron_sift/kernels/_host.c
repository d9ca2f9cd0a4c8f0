/*
 * neuron_sift.kernels._host: the CPU step's ranking and history update in one call each.
 *
 * Why C: on a CPU the step runs once per source batch between a DataLoader's and a
 * training step's work, with cold caches. There every NumPy or torch call costs several
 * microseconds, and the percentile needs a sort of the history (H values) and a binary
 * search per loss. Here the history is kept sorted across steps (a merge per step, no
 * sort) and each loss is ranked by a branch-free binary search.
 *
 * Results are identical to the torch kernels (tests/kernels/test_host.py and
 * tests/neuron_sift/engine/test_cpu_step.py compare them bit for bit): counts are exact
 * integers, and the percentile is the same single-precision expression
 * ((float)(less + not_greater) * 0.5f) / (float)fill (build flag -ffp-contract=off).
 *
 * Arrays come in through the buffer protocol (NumPy arrays, C-contiguous): no NumPy
 * headers are needed to build this. Built as an optional extension: without a compiler
 * neuron_sift uses the NumPy formulation in engine/cpu_step.py instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- order-preserving keys: float total order as unsigned integers ------------------ */

static inline uint32_t key_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* LSD radix sort of n floats by key_of (a total order; -0.0 before 0.0), into out.
 * tmp: n floats of scratch. Four passes of 8 bits: branch-free, O(n). */
static void radix_sort(const float *in, Py_ssize_t n, float *out, float *tmp) {
    const float *src = in;
    float *bufs[2] = {tmp, out};
    for (int pass = 0; pass < 4; pass++) {
        Py_ssize_t count[257] = {0};
        int shift = 8 * pass;
        for (Py_ssize_t i = 0; i < n; i++) count[((key_of(src[i]) >> shift) & 0xFF) + 1]++;
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        float *dst = bufs[pass & 1]; /* passes 0, 2 -> tmp; 1, 3 -> out: the result lands in out */
        for (Py_ssize_t i = 0; i < n; i++) dst[count[(key_of(src[i]) >> shift) & 0xFF]++] = src[i];
        src = dst;
    }
}

/* #{a[i] < x} and #{a[i] <= x} for sorted a (IEEE comparisons; x is finite). Branch-free
 * binary search: the step is masked arithmetic, not a branch, so random queries cost no
 * mispredictions. */
static inline Py_ssize_t count_less(const float *a, Py_ssize_t n, float x) {
    if (n == 0) return 0;
    const float *base = a;
    while (n > 1) {
        Py_ssize_t half = n / 2;
        base += half & -(Py_ssize_t)(base[half - 1] < x);
        n -= half;
    }
    return (base - a) + (*base < x);
}

static inline Py_ssize_t count_not_greater(const float *a, Py_ssize_t n, float x) {
    if (n == 0) return 0;
    const float *base = a;
    while (n > 1) {
        Py_ssize_t half = n / 2;
        base += half & -(Py_ssize_t)(base[half - 1] <= x);
        n -= half;
    }
    return (base - a) + (*base <= x);
}

/* ---- buffer helpers ------------------------------------------------------------------ */

static int get_buffer(PyObject *obj, Py_buffer *view, const char *fmt, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '=' || f[0] == '<' || f[0] == '@') f++;
    if (strcmp(f, fmt) != 0 || view->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "%s: a 1-D C-contiguous array of format '%s' is needed, got '%s' (%d-D)",
                     name, fmt, view->format ? view->format : "B", view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Mid-rank percentile of each valid loss among a[:fill] (sorted) into out; a non-finite loss
 * is ranked as 0.0 (the torch step ranks those as 0.0; they are kept whatever their rank);
 * padding rows (i >= n_valid) get 1.0, and so does everything when fill == 0. Returns the
 * number of non-finite valid losses. */
static Py_ssize_t rank_core(const float *l, Py_ssize_t n_valid, const float *a, Py_ssize_t fill, float *out,
                            Py_ssize_t rows) {
    Py_ssize_t nonfinite = 0;
    const float denom = (float)fill;
    for (Py_ssize_t i = 0; i < n_valid; i++) {
        float x = l[i];
        if (!isfinite(x)) { nonfinite++; x = 0.0f; }
        if (fill == 0) { out[i] = 1.0f; continue; }
        Py_ssize_t less = count_less(a, fill, x);
        Py_ssize_t not_greater = (less < fill && a[less] == x) ? count_not_greater(a, fill, x) : less;
        float twice = (float)(less + not_greater); /* exact below 2**24 */
        out[i] = (twice * 0.5f) / denom;
    }
    for (Py_ssize_t i = n_valid; i < rows; i++) out[i] = 1.0f;
    return nonfinite;
}

/* rank(losses, n_valid, ordered, fill, out) -> number of non-finite losses among the valid rows */
static PyObject *rank(PyObject *self, PyObject *args) {
    PyObject *lo, *oo, *outo;
    Py_ssize_t n_valid, fill;
    if (!PyArg_ParseTuple(args, "OnOnO", &lo, &n_valid, &oo, &fill, &outo)) return NULL;
    Py_buffer lb, ob, outb;
    if (get_buffer(lo, &lb, "f", 0, "losses") != 0) return NULL;
    if (get_buffer(oo, &ob, "f", 0, "ordered") != 0) { PyBuffer_Release(&lb); return NULL; }
    if (get_buffer(outo, &outb, "f", 1, "out") != 0) { PyBuffer_Release(&lb); PyBuffer_Release(&ob); return NULL; }
    Py_ssize_t rows = outb.shape[0];
    PyObject *result = NULL;
    if (n_valid < 0 || n_valid > rows || lb.shape[0] < n_valid || fill < 0 || fill > ob.shape[0]) {
        PyErr_SetString(PyExc_ValueError, "rank: sizes out of range");
        goto done;
    }
    result = PyLong_FromSsize_t(rank_core((const float *)lb.buf, n_valid, (const float *)ob.buf, fill,
                                          (float *)outb.buf, rows));
done:
    PyBuffer_Release(&lb); PyBuffer_Release(&ob); PyBuffer_Release(&outb);
    return result;
}

/* One scratch buffer for record_core, kept between calls and grown as needed: a fresh
 * malloc of tens of kB per source batch would be new memory for the cache every time.
 * Calls hold the GIL, so there is one user at a time. */
static float *g_work = NULL;
static size_t g_work_cells = 0;

static float *work_buffer(size_t cells) {
    if (cells > g_work_cells) {
        float *grown = (float *)realloc(g_work, sizeof(float) * cells);
        if (!grown) { PyErr_NoMemory(); return NULL; }
        g_work = grown;
        g_work_cells = cells;
    }
    return g_work;
}

/* Append values[i] (i < n, finite, mask[i] != 0 when mask is given) to the ring buffer hist
 * (h slots, the first fill in use, pos the next slot) in order, only the last h when more
 * come; ord holds hist[:fill] sorted and is kept so (overwritten values removed, new ones
 * merged in). Returns 0, or -1 with a Python exception set. */
static int record_core(const float *v, const char *m, Py_ssize_t n, float *hist, float *ord, Py_ssize_t h,
                       Py_ssize_t *pos_io, Py_ssize_t *fill_io) {
    Py_ssize_t pos = *pos_io, fill = *fill_io;
    /* work (4-byte cells): new values [n] | sorted new [n] | evicted [n] | sorted evicted [n] |
     * merged [h] | scratch [max(n, h)] | evicted keys [n + 1] | new keys [n + 1] */
    Py_ssize_t big = n > h ? n : h;
    float *work = work_buffer((size_t)(6 * n + h + big + 3));
    if (!work) return -1;
    float *fresh = work, *fresh_sorted = work + n, *evicted = work + 2 * n, *evicted_sorted = work + 3 * n;
    float *merged = work + 4 * n, *scratch = merged + h;
    uint32_t *evicted_keys = (uint32_t *)(scratch + big), *fresh_keys = evicted_keys + n + 1;
    int status = 0;
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((!m || m[i]) && isfinite(v[i])) fresh[w++] = v[i];
    if (w == 0) goto done;
    Py_ssize_t land = w < h ? w : h;
    const float *landing = fresh + (w - land);
    Py_ssize_t start = (pos + (w - land)) % h;
    Py_ssize_t new_fill = fill + w < h ? fill + w : h;
    if (land == h) { /* every slot is rewritten: sort afresh */
        for (Py_ssize_t j = 0; j < h; j++) hist[(start + j) % h] = landing[j];
        radix_sort(hist, h, ord, scratch);
    } else {
        Py_ssize_t e = 0;
        for (Py_ssize_t j = 0; j < land; j++) {
            Py_ssize_t s = (start + j) % h;
            if (s < fill) evicted[e++] = hist[s]; /* slots [0, fill) are in use */
            hist[s] = landing[j];
        }
        radix_sort(landing, land, fresh_sorted, scratch);
        radix_sort(evicted, e, evicted_sorted, scratch);
        /* merged = (ord[:fill] minus evicted) + fresh, in key order; removal matches bit
         * patterns. Branch-free: each step removes ord[i], or emits the smaller of ord[i]
         * and the next fresh value; sentinel keys (UINT32_MAX, above every float's) end the
         * evicted and fresh lists. */
        for (Py_ssize_t q = 0; q < e; q++) evicted_keys[q] = key_of(evicted_sorted[q]);
        for (Py_ssize_t q = 0; q < land; q++) fresh_keys[q] = key_of(fresh_sorted[q]);
        evicted_keys[e] = UINT32_MAX;
        fresh_keys[land] = UINT32_MAX;
        Py_ssize_t i = 0, j = 0, k = 0, o = 0;
        while (i < fill) {
            uint32_t ki = key_of(ord[i]);
            int removed = ki == evicted_keys[j];
            int fresh_first = !removed & (fresh_keys[k] < ki);
            merged[o] = fresh_first ? fresh_sorted[k] : ord[i];
            o += !removed;
            k += fresh_first;
            i += !fresh_first;
            j += removed;
        }
        while (k < land) merged[o++] = fresh_sorted[k++];
        if (j != e || o != new_fill) {
            PyErr_SetString(PyExc_RuntimeError, "record: the sorted history does not match the history");
            status = -1;
            goto done;
        }
        memcpy(ord, merged, sizeof(float) * (size_t)new_fill);
    }
    *pos_io = (pos + w) % h;
    *fill_io = new_fill;
done:
    return status;
}

/* record(values, mask, n, history, ordered, pos, fill) -> (pos, fill): record_core on arrays. */
static PyObject *record(PyObject *self, PyObject *args) {
    PyObject *vo, *mo, *ho, *oo;
    Py_ssize_t n, pos, fill;
    if (!PyArg_ParseTuple(args, "OOnOOnn", &vo, &mo, &n, &ho, &oo, &pos, &fill)) return NULL;
    Py_buffer vb, mb, hb, ob;
    int has_mask = mo != Py_None;
    if (get_buffer(vo, &vb, "f", 0, "values") != 0) return NULL;
    if (has_mask && get_buffer(mo, &mb, "?", 0, "mask") != 0) { PyBuffer_Release(&vb); return NULL; }
    if (get_buffer(ho, &hb, "f", 1, "history") != 0) {
        PyBuffer_Release(&vb); if (has_mask) PyBuffer_Release(&mb); return NULL;
    }
    if (get_buffer(oo, &ob, "f", 1, "ordered") != 0) {
        PyBuffer_Release(&vb); if (has_mask) PyBuffer_Release(&mb); PyBuffer_Release(&hb); return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t h = hb.shape[0];
    if (ob.shape[0] != h || h < 1 || n < 0 || n > vb.shape[0] || (has_mask && mb.shape[0] < n) || pos < 0 ||
        pos >= h || fill < 0 || fill > h) {
        PyErr_SetString(PyExc_ValueError, "record: sizes out of range");
        goto done;
    }
    if (record_core((const float *)vb.buf, has_mask ? (const char *)mb.buf : NULL, n, (float *)hb.buf,
                    (float *)ob.buf, h, &pos, &fill) == 0)
        result = Py_BuildValue("(nn)", pos, fill);
done:
    PyBuffer_Release(&vb); if (has_mask) PyBuffer_Release(&mb); PyBuffer_Release(&hb); PyBuffer_Release(&ob);
    return result;
}

/* sort(values, n, out): out[:n] = values[:n] sorted (the key order record() keeps). */
static PyObject *sort(PyObject *self, PyObject *args) {
    PyObject *vo, *outo;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OnO", &vo, &n, &outo)) return NULL;
    Py_buffer vb, outb;
    if (get_buffer(vo, &vb, "f", 0, "values") != 0) return NULL;
    if (get_buffer(outo, &outb, "f", 1, "out") != 0) { PyBuffer_Release(&vb); return NULL; }
    PyObject *result = NULL;
    float *scratch = NULL;
    if (n < 0 || n > vb.shape[0] || n > outb.shape[0]) {
        PyErr_SetString(PyExc_ValueError, "sort: sizes out of range");
        goto done;
    }
    scratch = (float *)malloc(sizeof(float) * (size_t)(n + 1));
    if (!scratch) { PyErr_NoMemory(); goto done; }
    radix_sort((const float *)vb.buf, n, (float *)outb.buf, scratch);
    Py_INCREF(Py_None);
    result = Py_None;
done:
    free(scratch);
    PyBuffer_Release(&vb); PyBuffer_Release(&outb);
    return result;
}

/* rank_and_record(losses, n_valid, history, ordered, pos, fill, out) -> (non-finite, pos, fill)
 * rank() against the history as it is, then record() of the valid finite losses: one call
 * for the common step (no global history). */
static PyObject *rank_and_record(PyObject *self, PyObject *args) {
    PyObject *lo, *ho, *oo, *outo;
    Py_ssize_t n_valid, pos, fill;
    if (!PyArg_ParseTuple(args, "OnOOnnO", &lo, &n_valid, &ho, &oo, &pos, &fill, &outo)) return NULL;
    Py_buffer lb, hb, ob, outb;
    if (get_buffer(lo, &lb, "f", 0, "losses") != 0) return NULL;
    if (get_buffer(ho, &hb, "f", 1, "history") != 0) { PyBuffer_Release(&lb); return NULL; }
    if (get_buffer(oo, &ob, "f", 1, "ordered") != 0) { PyBuffer_Release(&lb); PyBuffer_Release(&hb); return NULL; }
    if (get_buffer(outo, &outb, "f", 1, "out") != 0) {
        PyBuffer_Release(&lb); PyBuffer_Release(&hb); PyBuffer_Release(&ob); return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t h = hb.shape[0], rows = outb.shape[0];
    if (n_valid < 0 || n_valid > rows || lb.shape[0] < n_valid || ob.shape[0] != h || h < 1 || pos < 0 ||
        pos >= h || fill < 0 || fill > h) {
        PyErr_SetString(PyExc_ValueError, "rank_and_record: sizes out of range");
        goto done;
    }
    const float *l = (const float *)lb.buf;
    float *hist = (float *)hb.buf, *ord = (float *)ob.buf;
    Py_ssize_t nonfinite = rank_core(l, n_valid, ord, fill, (float *)outb.buf, rows);
    if (record_core(l, NULL, n_valid, hist, ord, h, &pos, &fill) == 0)
        result = Py_BuildValue("(nnn)", nonfinite, pos, fill);
done:
    PyBuffer_Release(&lb); PyBuffer_Release(&hb); PyBuffer_Release(&ob); PyBuffer_Release(&outb);
    return result;
}

/* ---- the counter-based hash of kernels/random.py ------------------------------------- */

static inline uint64_t mix31(uint64_t x) {
    x &= 0x7FFFFFFFull;
    x ^= x >> 16;
    x = (x * 0x2C1B3C6Dull) & 0x7FFFFFFFull;
    x ^= x >> 15;
    x = (x * 0x297A2D39ull) & 0x7FFFFFFFull;
    return x ^ (x >> 16);
}

static inline float uniform_at(uint64_t key, uint64_t row) {
    uint64_t h = mix31(mix31(key ^ mix31(row + 0x1E3779B9ull)) + row);
    return ((float)(h >> 8) + 0.5f) * (1.0f / 8388608.0f); /* exact: 23-bit integers */
}

static inline uint64_t draw_key(long long seed, long long counter) {
    return mix31(mix31((uint64_t)seed + 0x1E3779B9ull) ^ ((uint64_t)counter & 0x7FFFFFFFull));
}

/* uniforms(seed, counter, out): out[r] = uniform_from_counter(seed, counter, len(out))[r] */
static PyObject *uniforms(PyObject *self, PyObject *args) {
    long long seed, counter;
    PyObject *outo;
    if (!PyArg_ParseTuple(args, "LLO", &seed, &counter, &outo)) return NULL;
    if (seed < 0 || counter < 0) {
        PyErr_SetString(PyExc_ValueError, "uniforms: seed and counter must be >= 0");
        return NULL;
    }
    Py_buffer outb;
    if (get_buffer(outo, &outb, "f", 1, "out") != 0) return NULL;
    float *out = (float *)outb.buf;
    uint64_t key = draw_key(seed, counter);
    for (Py_ssize_t r = 0; r < outb.shape[0]; r++) out[r] = uniform_at(key, (uint64_t)r);
    PyBuffer_Release(&outb);
    Py_RETURN_NONE;
}

/* draw_keep(seed, counter, p, losses, n_valid, out) -> kept count
 * The probabilistic draw: row i < n_valid is kept when its uniform (uniforms(seed, counter))
 * is below p[i], or when losses[i] is not finite (always kept). The kept rows, ascending,
 * go to out[:count] (int64). */
static PyObject *draw_keep(PyObject *self, PyObject *args) {
    long long seed, counter;
    PyObject *po, *lo, *outo;
    Py_ssize_t n_valid;
    if (!PyArg_ParseTuple(args, "LLOOnO", &seed, &counter, &po, &lo, &n_valid, &outo)) return NULL;
    if (seed < 0 || counter < 0) {
        PyErr_SetString(PyExc_ValueError, "draw_keep: seed and counter must be >= 0");
        return NULL;
    }
    Py_buffer pb, lb, outb;
    if (get_buffer(po, &pb, "f", 0, "p") != 0) return NULL;
    if (get_buffer(lo, &lb, "f", 0, "losses") != 0) { PyBuffer_Release(&pb); return NULL; }
    if (PyObject_GetBuffer(outo, &outb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
        PyBuffer_Release(&pb); PyBuffer_Release(&lb); return NULL;
    }
    PyObject *result = NULL;
    if (outb.ndim != 1 || outb.itemsize != 8 || !outb.format || !strchr("lq", outb.format[strlen(outb.format) - 1])) {
        PyErr_SetString(PyExc_TypeError, "draw_keep: out must be a 1-D C-contiguous int64 array");
        goto done;
    }
    if (n_valid < 0 || n_valid > pb.shape[0] || n_valid > lb.shape[0] || n_valid > outb.shape[0]) {
        PyErr_SetString(PyExc_ValueError, "draw_keep: sizes out of range");
        goto done;
    }
    const float *p = (const float *)pb.buf, *l = (const float *)lb.buf;
    int64_t *out = (int64_t *)outb.buf;
    uint64_t key = draw_key(seed, counter);
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n_valid; i++) {
        out[count] = i;
        count += (uniform_at(key, (uint64_t)i) < p[i]) | !isfinite(l[i]);
    }
    result = PyLong_FromSsize_t(count);
done:
    PyBuffer_Release(&pb); PyBuffer_Release(&lb); PyBuffer_Release(&outb);
    return result;
}

static PyMethodDef methods[] = {
    {"rank_and_record", rank_and_record, METH_VARARGS,
     "rank_and_record(losses, n_valid, history, ordered, pos, fill, out) -> (non-finite count, pos, fill)"},
    {"draw_keep", draw_keep, METH_VARARGS, "draw_keep(seed, counter, p, losses, n_valid, out) -> kept count"},
    {"uniforms", uniforms, METH_VARARGS, "uniforms(seed, counter, out): the hash uniforms of draw number counter"},
    {"rank", rank, METH_VARARGS, "rank(losses, n_valid, ordered, fill, out) -> non-finite count"},
    {"record", record, METH_VARARGS, "record(values, mask, n, history, ordered, pos, fill) -> (pos, fill)"},
    {"sort", sort, METH_VARARGS, "sort(values, n, out): out[:n] = sorted values[:n]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_host", "CPU kernels of the host sifting step.", -1, methods};

PyMODINIT_FUNC PyInit__host(void) { return PyModule_Create(&module); }
