/* The autograd-graph walk of precdbg_pt.graph.watch_backward, in C.
 *
 * watch_backward runs once per captured call whose backward is watched (tens to hundreds per
 * dumped step). It walks the nodes the call created, from its outputs' nodes back to its
 * inputs', to find the edges into the inputs: a few nodes per call, ~600-800 per dumped step of
 * the bundled GPT. In Python the interpreter's work per node is about twice torch's own
 * (building the node's `next_functions`); here the walks of a dumped step take ~2.5x fewer
 * instructions (callgrind: 2.6 M -> 0.9 M at level module, 4.4 M -> 1.8 M at mix). Only the
 * Python C API is used (no torch headers): nodes are opaque objects, hashed and compared as
 * Python does.
 *
 * walk(start, node_targets, target_nodes, leaf_targets, accumulate, node_limit, expected)
 *     -> edges
 * is precdbg_pt.graph._walk_python step for step (same visiting order, same edges in the same
 * order, same nodes counted against node_limit); see it for what the arguments are. `expected`
 * (a list) is updated in place; `edges` {node: [(position, target index)]} is returned.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *str_next_functions;    /* interned attribute names */
static PyObject *str_variable;

/* The nodes still to visit: strong references, popped from the end like a Python list. */
typedef struct {
    PyObject **items;
    Py_ssize_t size, capacity;
} NodeStack;

static int stack_push(NodeStack *stack, PyObject *node) {
    if (stack->size == stack->capacity) {
        Py_ssize_t capacity = stack->capacity ? 2 * stack->capacity : 64;
        if ((size_t)capacity > PY_SSIZE_T_MAX / sizeof(PyObject *)) {
            PyErr_NoMemory();
            return -1;
        }
        PyObject **items = PyMem_Realloc(stack->items, capacity * sizeof(PyObject *));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        stack->items = items;
        stack->capacity = capacity;
    }
    Py_INCREF(node);
    stack->items[stack->size++] = node;
    return 0;
}

static void stack_free(NodeStack *stack) {
    while (stack->size > 0) Py_DECREF(stack->items[--stack->size]);
    PyMem_Free(stack->items);
    stack->items = NULL;
    stack->capacity = 0;
}

/* An entry of next_functions as the tuple (node, output_nr). torch gives exact 2-tuples, which
 * are used as they are: equal to, and hashing as, the key (node, nr) the Python walk builds.
 * Anything else is unpacked as `nxt, nr = entry` would (same errors). New reference. */
static PyObject *as_pair(PyObject *entry) {
    if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2) {
        Py_INCREF(entry);
        return entry;
    }
    PyObject *pair = PySequence_Tuple(entry);
    if (pair == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(pair);
    if (n != 2) {
        Py_DECREF(pair);
        if (n > 2)
            PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
        else
            PyErr_Format(PyExc_ValueError, "not enough values to unpack (expected 2, got %zd)",
                         n);
        return NULL;
    }
    return pair;
}

/* An edge from `node` (its input `position`) into a target group `hits` (the indices of the
 * targets that are one tensor): the k-th edge met for the group goes to its k-th index, extra
 * edges to the last (they sum into it). Appends (position, index) to edges[node] and counts it
 * in expected[index]. */
static int add_edge(PyObject *edges, PyObject *edges_found, PyObject *expected, PyObject *node,
                    Py_ssize_t position, PyObject *hits) {
    PyObject *first = NULL, *count = NULL, *index = NULL, *edge = NULL, *old = NULL, *new = NULL;
    int rc = -1;
    Py_ssize_t n_hits = PySequence_Size(hits);
    if (n_hits < 0) goto done;
    first = PySequence_GetItem(hits, 0);
    if (first == NULL) goto done;
    PyObject *found = PyDict_GetItemWithError(edges_found, first);    /* borrowed */
    Py_ssize_t k = 0;
    if (found != NULL) {
        k = PyLong_AsSsize_t(found);
        if (k == -1 && PyErr_Occurred()) goto done;
    } else if (PyErr_Occurred()) {
        goto done;
    }
    count = PyLong_FromSsize_t(k + 1);
    if (count == NULL || PyDict_SetItem(edges_found, first, count) < 0) goto done;
    index = PySequence_GetItem(hits, k < n_hits ? k : n_hits - 1);
    if (index == NULL) goto done;
    edge = PyTuple_New(2);
    if (edge == NULL) goto done;
    PyObject *position_int = PyLong_FromSsize_t(position);
    if (position_int == NULL) goto done;
    PyTuple_SET_ITEM(edge, 0, position_int);                         /* steals */
    Py_INCREF(index);
    PyTuple_SET_ITEM(edge, 1, index);
    PyObject *node_edges = PyDict_GetItemWithError(edges, node);     /* borrowed */
    if (node_edges != NULL) {
        if (PyList_Append(node_edges, edge) < 0) goto done;
    } else {
        if (PyErr_Occurred()) goto done;
        node_edges = PyList_New(1);
        if (node_edges == NULL) goto done;
        Py_INCREF(edge);
        PyList_SET_ITEM(node_edges, 0, edge);                        /* steals */
        int set = PyDict_SetItem(edges, node, node_edges);
        Py_DECREF(node_edges);
        if (set < 0) goto done;
    }
    old = PyObject_GetItem(expected, index);                         /* expected[ti] += 1 */
    if (old == NULL) goto done;
    PyObject *one = PyLong_FromLong(1);                              /* a cached small int */
    new = PyNumber_InPlaceAdd(old, one);
    Py_DECREF(one);
    if (new == NULL || PyObject_SetItem(expected, index, new) < 0) goto done;
    rc = 0;
done:
    Py_XDECREF(first);
    Py_XDECREF(count);
    Py_XDECREF(index);
    Py_XDECREF(edge);
    Py_XDECREF(old);
    Py_XDECREF(new);
    return rc;
}

/* The arguments of one walk, and what it fills. */
typedef struct {
    PyObject *node_targets, *target_nodes, *leaf_targets, *accumulate, *expected;
    PyObject *visited, *edges_found, *edges;
    NodeStack stack;
} Walk;

/* The edges of one node into the targets; the other nodes it leads to, not visited yet, go on
 * the stack (in next_functions order: the last is visited first). */
static int visit(Walk *walk, PyObject *node) {
    PyObject *next = PyObject_GetAttr(node, str_next_functions);
    if (next == NULL) return -1;
    PyObject *entries = PySequence_Fast(next, "next_functions must be iterable");
    Py_DECREF(next);
    if (entries == NULL) return -1;
    int rc = -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(entries);
    for (Py_ssize_t position = 0; position < n; position++) {
        PyObject *pair = as_pair(PySequence_Fast_GET_ITEM(entries, position));
        if (pair == NULL) goto done;
        PyObject *nxt = PyTuple_GET_ITEM(pair, 0);
        PyObject *hits = NULL;                     /* the target group of the edge, or none */
        int ok = 0;
        if (nxt == Py_None) {
            ok = 1;
        } else {
            int is_target = PySet_Contains(walk->target_nodes, nxt);
            if (is_target > 0) {                   /* an input's node: an edge into it, or a stop */
                hits = PyDict_GetItemWithError(walk->node_targets, pair);
                Py_XINCREF(hits);
                ok = hits != NULL || !PyErr_Occurred();
            } else if (is_target == 0 && (PyObject *)Py_TYPE(nxt) == walk->accumulate) {
                PyObject *variable = PyObject_GetAttr(nxt, str_variable);   /* a leaf */
                PyObject *id = variable != NULL ? PyLong_FromVoidPtr(variable) : NULL;
                Py_XDECREF(variable);
                if (id != NULL) {
                    hits = PyDict_GetItemWithError(walk->leaf_targets, id);
                    Py_XINCREF(hits);
                    ok = hits != NULL || !PyErr_Occurred();
                    Py_DECREF(id);
                }
            } else if (is_target == 0) {
                int seen = PySet_Contains(walk->visited, nxt);
                ok = seen > 0 || (seen == 0 && stack_push(&walk->stack, nxt) == 0);
            }
        }
        if (hits == Py_None)                       /* as `if hits is None: continue` */
            Py_CLEAR(hits);
        if (ok && hits != NULL)
            ok = add_edge(walk->edges, walk->edges_found, walk->expected, node, position,
                          hits) == 0;
        Py_XDECREF(hits);
        Py_DECREF(pair);
        if (!ok) goto done;
    }
    rc = 0;
done:
    Py_DECREF(entries);
    return rc;
}

/* METH_FASTCALL: most walks visit a few nodes, so the call itself is a good part of one (no
 * argument tuple, no format string). */
static PyObject *graphwalk_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "walk() takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    Walk walk = {0};
    PyObject *start = args[0], *limit = args[5];
    walk.node_targets = args[1];
    walk.target_nodes = args[2];
    walk.leaf_targets = args[3];
    walk.accumulate = args[4];
    walk.expected = args[6];
    if (!PyDict_Check(walk.node_targets) || !PyAnySet_Check(walk.target_nodes) ||
        !PyDict_Check(walk.leaf_targets)) {
        PyErr_SetString(PyExc_TypeError,
                        "walk: node_targets and leaf_targets must be dicts, target_nodes a set");
        return NULL;
    }
    Py_ssize_t node_limit = PyNumber_AsSsize_t(limit, NULL);   /* clipped, as a bound */
    if (node_limit == -1 && PyErr_Occurred()) return NULL;
    PyObject *start_nodes = PySequence_Fast(start, "walk: start must be iterable");
    if (start_nodes == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(start_nodes); i++) {
        if (stack_push(&walk.stack, PySequence_Fast_GET_ITEM(start_nodes, i)) < 0) {
            Py_DECREF(start_nodes);
            stack_free(&walk.stack);
            return NULL;
        }
    }
    Py_DECREF(start_nodes);
    walk.visited = PySet_New(NULL);
    walk.edges_found = PyDict_New();       /* per target group (its first index): edges met */
    walk.edges = PyDict_New();
    if (walk.visited == NULL || walk.edges_found == NULL || walk.edges == NULL) goto fail;
    while (walk.stack.size > 0 && PySet_GET_SIZE(walk.visited) < node_limit) {
        PyObject *node = walk.stack.items[--walk.stack.size];     /* owned */
        int seen = PySet_Contains(walk.visited, node);
        int ok = seen > 0 || (seen == 0 && PySet_Add(walk.visited, node) == 0 &&
                              visit(&walk, node) == 0);
        Py_DECREF(node);
        if (!ok) goto fail;
    }
    stack_free(&walk.stack);
    Py_DECREF(walk.visited);
    Py_DECREF(walk.edges_found);
    return walk.edges;
fail:
    stack_free(&walk.stack);
    Py_XDECREF(walk.visited);
    Py_XDECREF(walk.edges_found);
    Py_XDECREF(walk.edges);
    return NULL;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))graphwalk_walk, METH_FASTCALL,
     "walk(start, node_targets, target_nodes, leaf_targets, accumulate, node_limit, expected) "
     "-> {node: [(position, target index)]}; counts each edge in expected (a list)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_graphwalk",
                                    "The autograd-graph walk of watch_backward.", -1, methods};

PyMODINIT_FUNC PyInit__graphwalk(void) {
    if (str_next_functions == NULL) {
        str_next_functions = PyUnicode_InternFromString("next_functions");
        str_variable = PyUnicode_InternFromString("variable");
        if (str_next_functions == NULL || str_variable == NULL) {
            Py_CLEAR(str_next_functions);
            Py_CLEAR(str_variable);
            return NULL;
        }
    }
    return PyModule_Create(&module);
}
