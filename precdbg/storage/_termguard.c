/* SIGTERM while precdbg writes a stopped step: the step is finished first, then the process
 * ends by SIGTERM's default action, exactly as it would have without precdbg.
 *
 * Why C: a Python-level handler runs only when the main thread next executes bytecode, so a
 * main thread hung inside C code (a collective waiting for a dead peer) would make the process
 * immune to SIGTERM. Here the handler only wakes a watcher pthread, which needs no GIL: it waits
 * while precdbg's writer finishes the steps that were stopped before the signal and keeps
 * making progress, then restores the default action and sends SIGTERM again. A writer that
 * makes no progress for `stall` seconds, or a second SIGTERM, ends the process at once.
 *
 * Installed only over the default action (a handler the user or a framework installed is left
 * alone); a forked child that inherits the handler but not the watcher gets the default action.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_long queued;        /* stopped steps handed to a writer */
static atomic_long finished;      /* of those, written (or given up) */
static atomic_long progress;      /* grows with everything a writer writes */
static atomic_int terminating;    /* a SIGTERM was deferred */
static atomic_long capturing;     /* capture windows open (start() ran, stop() not yet) */
static volatile pid_t owner;      /* the process whose watcher listens */
static int wake[2] = {-1, -1};
static double stall_seconds = 30.0;

static void say(const char *text) {
    ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
    (void)ignored;
}

static void default_action_now(void) {
    struct sigaction dfl;
    sigset_t term;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTERM, &dfl, NULL);
    kill(getpid(), SIGTERM);
    sigemptyset(&term);                 /* this thread may take it too (all others may block it) */
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_UNBLOCK, &term, NULL);
}

static void on_sigterm(int signum) {
    int saved = errno;
    (void)signum;
    if (getpid() != owner || atomic_exchange(&terminating, 1)) {
        default_action_now();      /* a forked child, or the second SIGTERM */
    } else {
        char byte = 1;
        if (write(wake[1], &byte, 1) != 1)
            default_action_now();
    }
    errno = saved;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *watch(void *unused) {
    char byte;
    ssize_t got;
    (void)unused;
    do {
        got = read(wake[0], &byte, 1);
    } while (got < 0 && errno == EINTR);
    if (got != 1)
        return NULL;
    long target = atomic_load(&queued);
    if (atomic_load(&finished) < target) {
        say("precdbg: SIGTERM: writing the stopped step before the process ends "
            "(send SIGTERM again to end it now)\n");
        long last = atomic_load(&progress);
        double since = now();
        struct timespec tick = {0, 20 * 1000 * 1000};
        while (atomic_load(&finished) < target) {
            nanosleep(&tick, NULL);
            long seen = atomic_load(&progress);
            if (seen != last) {
                last = seen;
                since = now();
            } else if (now() - since > stall_seconds) {
                say("precdbg: SIGTERM: the writer made no progress; ending the process "
                    "(the step being written stays a .partial)\n");
                break;
            }
        }
    }
    if (atomic_load(&capturing) > 0)
        say("precdbg: SIGTERM while a step was being captured (start() ran, stop() had not): "
            "that step is not written; steps stopped before it are\n");
    default_action_now();
    return NULL;
}

static PyObject *install(PyObject *self, PyObject *args) {
    double stall;
    struct sigaction current, ours;
    pthread_t thread;
    pthread_attr_t attr;
    sigset_t all, before;
    (void)self;
    if (!PyArg_ParseTuple(args, "d", &stall))
        return NULL;
    if (owner == getpid())
        Py_RETURN_TRUE;                     /* installed already in this process */
    if (sigaction(SIGTERM, NULL, &current) != 0)
        Py_RETURN_FALSE;
    if (current.sa_handler != on_sigterm &&
        ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL))
        Py_RETURN_FALSE;                    /* somebody's own handler, or SIGTERM ignored */
    if (wake[0] >= 0) {                     /* the parent's pipe, inherited through fork */
        close(wake[0]);
        close(wake[1]);
        wake[0] = wake[1] = -1;
    }
    if (pipe(wake) != 0)
        Py_RETURN_FALSE;
    fcntl(wake[0], F_SETFD, FD_CLOEXEC);
    fcntl(wake[1], F_SETFD, FD_CLOEXEC);
    stall_seconds = stall;
    atomic_store(&terminating, 0);          /* a forked child counts its own steps only */
    atomic_store(&queued, 0);
    atomic_store(&finished, 0);
    sigfillset(&all);                       /* the watcher never takes a signal itself */
    pthread_sigmask(SIG_SETMASK, &all, &before);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);   /* it only reads, sleeps and counts */
    int failed = pthread_create(&thread, &attr, watch, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (failed) {
        close(wake[0]);
        close(wake[1]);
        wake[0] = wake[1] = -1;
        Py_RETURN_FALSE;
    }
    owner = getpid();
    memset(&ours, 0, sizeof ours);
    ours.sa_handler = on_sigterm;
    ours.sa_flags = SA_RESTART;
    sigfillset(&ours.sa_mask);
    if (sigaction(SIGTERM, &ours, NULL) != 0)
        Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

static PyObject *note_queued(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    atomic_fetch_add(&queued, 1);
    Py_RETURN_NONE;
}

static PyObject *note_finished(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    atomic_fetch_add(&finished, 1);
    atomic_fetch_add(&progress, 1);
    Py_RETURN_NONE;
}

static PyObject *note_progress(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    atomic_fetch_add(&progress, 1);
    Py_RETURN_NONE;
}

static PyObject *note_capturing(PyObject *self, PyObject *args) {
    int delta;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &delta))
        return NULL;
    atomic_fetch_add(&capturing, delta);
    Py_RETURN_NONE;
}

static PyObject *deferred(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyBool_FromLong(owner == getpid() && atomic_load(&terminating));
}

static PyObject *end_by_sigterm(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    default_action_now();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(stall_seconds) -> bool: defer SIGTERM while stopped steps are written"},
    {"note_queued", note_queued, METH_NOARGS, "a stopped step was handed to a writer"},
    {"note_finished", note_finished, METH_NOARGS, "a stopped step was written or given up"},
    {"note_progress", note_progress, METH_NOARGS, "a writer wrote something"},
    {"note_capturing", note_capturing, METH_VARARGS,
     "note_capturing(+1 | -1): a capture window opened or closed"},
    {"deferred", deferred, METH_NOARGS, "True once a SIGTERM waits for the writers"},
    {"end_by_sigterm", end_by_sigterm, METH_NOARGS,
     "end the process by SIGTERM's default action (after a deferred SIGTERM)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_termguard",
    "SIGTERM waits for the stopped steps precdbg is writing (a watcher thread, no GIL).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__termguard(void) { return PyModule_Create(&module); }
