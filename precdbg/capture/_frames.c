/* The key of the user-code part of the current call stack, walked in C.
 *
 * precdbg.capture.call_stacks.StackTable asks for it once per captured call. The walk passes through the
 * framework's own frames (torch.nn.Module._call_impl, functional wrappers, precdbg's hooks) to
 * collect up to `limit` user frames; in Python each frame costs ~0.25 us, here a few ns.
 *
 * key(depth, internal, limit) -> tuple of ints | None
 *   depth: frames to skip above the caller's own frame (sys._getframe(depth) from the caller);
 *   internal: dict {id(code object): (code object, is_internal)} kept by the caller;
 *   returns (id(code), instruction offset, ...) of the first `limit` frames whose code is not
 *   internal, or None when a frame's code is not in `internal` yet: the caller then walks in
 *   Python and classifies it (once per code object).
 * Python 3.11 or later (PyFrame_GetLasti); earlier versions build a module that answers None.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

#define MAX_LIMIT 64

static PyObject *frames_key(PyObject *self, PyObject *args) {
    int depth, limit;
    PyObject *internal;
    if (!PyArg_ParseTuple(args, "iO!i", &depth, &PyDict_Type, &internal, &limit)) return NULL;
#if PY_VERSION_HEX >= 0x030B0000
    if (limit < 0 || limit > MAX_LIMIT || depth < 0) {
        PyErr_SetString(PyExc_ValueError, "depth must be >= 0 and limit in 0..64");
        return NULL;
    }
    PyObject *parts[2 * MAX_LIMIT];
    int n = 0, found = 0, unknown = 0;
    PyFrameObject *frame = PyEval_GetFrame();      /* borrowed */
    Py_XINCREF(frame);
    for (int i = 0; i < depth && frame != NULL; i++) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    while (frame != NULL && found < limit) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        PyObject *id = PyLong_FromVoidPtr(code);
        if (id == NULL) { Py_DECREF(code); goto fail; }
        PyObject *known = PyDict_GetItemWithError(internal, id);    /* borrowed */
        if (known == NULL) {
            Py_DECREF(id); Py_DECREF(code);
            if (PyErr_Occurred()) goto fail;
            unknown = 1;
            break;
        }
        PyObject *flag = PyTuple_Check(known) && PyTuple_GET_SIZE(known) == 2
                             ? PyTuple_GET_ITEM(known, 1) : NULL;
        int is_internal = flag != NULL ? PyObject_IsTrue(flag) : -1;
        if (is_internal < 0) {
            Py_DECREF(id); Py_DECREF(code);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "internal: values must be (code, bool)");
            goto fail;
        }
        if (!is_internal) {
            PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(frame));
            if (lasti == NULL) { Py_DECREF(id); Py_DECREF(code); goto fail; }
            parts[n++] = id;
            parts[n++] = lasti;
            found++;
        } else {
            Py_DECREF(id);
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    if (unknown) {
        for (int i = 0; i < n; i++) Py_DECREF(parts[i]);
        Py_RETURN_NONE;
    }
    PyObject *key = PyTuple_New(n);
    if (key == NULL) {
        for (int i = 0; i < n; i++) Py_DECREF(parts[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++) PyTuple_SET_ITEM(key, i, parts[i]);    /* steals */
    return key;
fail:
    Py_XDECREF(frame);
    for (int i = 0; i < n; i++) Py_DECREF(parts[i]);
    return NULL;
#else
    (void)depth; (void)internal; (void)limit;
    Py_RETURN_NONE;
#endif
}

static PyMethodDef methods[] = {
    {"key", frames_key, METH_VARARGS,
     "key(depth, internal, limit) -> (code id, instruction offset, ...) of the first `limit` "
     "frames whose code is not internal, or None when a code object is not classified yet"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames",
                                    "The user-code key of the current call stack.", -1, methods};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
