/*
 * demollm._C -- the compiled ops of the demo package, in the plain CPython C API.
 *
 * Plays the role of vLLM's vllm/_C extension: Python code reaches it through
 * demollm/_custom_ops.py (rms_norm) and demollm/model.py (generation).
 *
 *   rms_norm(out, input, weight, epsilon) -> None
 *       out, input: float32 buffers of rows*hidden items (flattened [rows, hidden]);
 *       weight: float32 buffer of hidden items.  For each row,
 *       out[j] = input[j] / sqrt(mean(input_row^2) + epsilon) * weight[j].
 *   next_logits(table, vocab_size, prev_token) -> list[float]
 *       table: float32 buffer of vocab_size*vocab_size items (a bigram table);
 *       returns row prev_token: the logits of the token that follows it.
 *   log_softmax(logits) -> list[float]
 *       logits: a sequence of floats; numerically stable log-softmax.
 *
 * Float32 buffers are anything exporting the buffer protocol with format "f",
 * e.g. array.array('f').  Size mismatches raise ValueError; wrong element
 * types raise TypeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

/* Get a C-contiguous float32 buffer from obj; returns 0 on success. */
static int get_f32(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a %s C-contiguous float32 buffer",
                     name, writable ? "writable" : "readable");
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (f[0] == '@' || f[0] == '=' || f[0] == '<')
        f++;
    if (strcmp(f, "f") != 0 || view->itemsize != 4) {
        PyErr_Format(PyExc_TypeError, "%s must hold float32 ('f'), got format '%s'",
                     name, view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *rms_norm(PyObject *self, PyObject *args)
{
    PyObject *out_o, *in_o, *w_o;
    double eps;
    Py_buffer out, in, w;
    if (!PyArg_ParseTuple(args, "OOOd:rms_norm", &out_o, &in_o, &w_o, &eps))
        return NULL;
    if (get_f32(out_o, &out, 1, "out") != 0)
        return NULL;
    if (get_f32(in_o, &in, 0, "input") != 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (get_f32(w_o, &w, 0, "weight") != 0) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&in);
        return NULL;
    }

    Py_ssize_t n = in.len / 4, hidden = w.len / 4;
    PyObject *result = NULL;
    if (hidden == 0 || n % hidden != 0) {
        PyErr_Format(PyExc_ValueError,
                     "input has %zd elements, not a multiple of hidden size %zd", n, hidden);
    } else if (out.len / 4 != n) {
        PyErr_Format(PyExc_ValueError, "out has %zd elements, input has %zd",
                     out.len / 4, n);
    } else if (!(eps >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "epsilon must be >= 0");
    } else {
        const float *x = (const float *)in.buf, *g = (const float *)w.buf;
        float *y = (float *)out.buf;
        for (Py_ssize_t r = 0; r < n / hidden; r++) {
            const float *xr = x + r * hidden;
            float *yr = y + r * hidden;
            double sumsq = 0.0;
            for (Py_ssize_t j = 0; j < hidden; j++)
                sumsq += (double)xr[j] * (double)xr[j];
            double inv = 1.0 / sqrt(sumsq / (double)hidden + eps);
            /* reads xr[j] before writing yr[j], so out may alias input */
            for (Py_ssize_t j = 0; j < hidden; j++)
                yr[j] = (float)((double)xr[j] * inv * (double)g[j]);
        }
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&in);
    PyBuffer_Release(&w);
    return result;
}

static PyObject *next_logits(PyObject *self, PyObject *args)
{
    PyObject *table_o;
    Py_ssize_t vocab, prev;
    Py_buffer table;
    if (!PyArg_ParseTuple(args, "Onn:next_logits", &table_o, &vocab, &prev))
        return NULL;
    if (get_f32(table_o, &table, 0, "table") != 0)
        return NULL;

    PyObject *result = NULL;
    if (vocab <= 0 || table.len / 4 != vocab * vocab) {
        PyErr_Format(PyExc_ValueError, "table has %zd elements, expected %zd x %zd",
                     table.len / 4, vocab, vocab);
    } else if (prev < 0 || prev >= vocab) {
        PyErr_Format(PyExc_ValueError, "token id %zd out of range [0, %zd)", prev, vocab);
    } else if ((result = PyList_New(vocab)) != NULL) {
        const float *row = (const float *)table.buf + prev * vocab;
        for (Py_ssize_t j = 0; j < vocab; j++) {
            PyObject *v = PyFloat_FromDouble((double)row[j]);
            if (v == NULL) {
                Py_CLEAR(result);
                break;
            }
            PyList_SET_ITEM(result, j, v);
        }
    }
    PyBuffer_Release(&table);
    return result;
}

static PyObject *log_softmax(PyObject *self, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "logits must be a sequence of floats");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    double *v = NULL;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "logits must not be empty");
        goto done;
    }
    if ((v = PyMem_Malloc(n * sizeof(double))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    double mx = -INFINITY;
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (v[i] == -1.0 && PyErr_Occurred())
            goto done;
        if (v[i] > mx)
            mx = v[i];
    }
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < n; i++)
        sum += exp(v[i] - mx);
    double lse = mx + log(sum);
    if ((result = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyFloat_FromDouble(v[i] - lse);
        if (f == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, f);
    }
done:
    PyMem_Free(v);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"rms_norm", rms_norm, METH_VARARGS,
     "rms_norm(out, input, weight, epsilon) -> None: RMS-normalize float32 rows into out."},
    {"next_logits", next_logits, METH_VARARGS,
     "next_logits(table, vocab_size, prev_token) -> list[float]: bigram logits row."},
    {"log_softmax", log_softmax, METH_O,
     "log_softmax(logits) -> list[float]: numerically stable log-softmax."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "demollm._C",
    "Compiled ops of the demollm demo package (stand-in for vllm._C).", -1, methods,
};

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModule_Create(&module);
}
