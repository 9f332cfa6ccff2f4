/* SIGTERM while precdbg writes a stopped step: training stops at once, the stopped steps are
 * finished, then the process ends by SIGTERM's default action, as it would have without precdbg.
 *
 * Why C: a Python-level handler runs only when the main thread next executes bytecode, so a
 * main thread hung inside C code (a collective waiting for a dead peer) would make the process
 * immune to SIGTERM. Here the handler only wakes a watcher pthread, which needs no GIL. The
 * watcher first parks the main thread: a pending call (Py_AddPendingCall, which needs no GIL)
 * that the main thread runs at its next bytecode boundary releases the GIL and sleeps until the
 * process ends, so no user code runs after the signal (no optimizer step, no side effect) while
 * the writer, a Python thread, can still take the GIL. The handler, when it runs on the main
 * thread, waits (at most 200 ms) until the watcher has asked for that park, so the main thread
 * does not run on meanwhile. The watcher then waits while a stop() hands its step to a writer
 * (`hand_over`) and until the writers have finished every step handed to them, while they
 * make progress, and ends the process by SIGTERM's default action. A writer that makes no
 * progress for `stall` seconds, or a second SIGTERM, ends the process at once.
 *
 * The main thread is never parked inside a no-park section (`hold`): precdbg's own code that
 * holds a lock the writer needs, or a stop() handing its step over. A park asked for inside one
 * happens when the outermost section ends.
 *
 * Installed only over the default action (a handler the user or a framework installed is left
 * alone); a forked child that inherits the handler but not the watcher gets the default action.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <pythread.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_long queued;        /* stopped steps handed to a writer */
static atomic_long finished;      /* of those, written (or given up) */
static atomic_long progress;      /* grows with everything a writer writes */
static atomic_int terminating;    /* a SIGTERM was deferred */
static atomic_long capturing;     /* capture windows open (start() ran, stop() not yet) */
static atomic_long captured_step; /* the step of the window opened last (-1: not known) */
static atomic_long handing;       /* stop()s handing a step to a writer, on any thread */
static atomic_long holding;       /* the main thread's no-park sections */
static atomic_int park_wanted;    /* a park asked for inside a no-park section */
static atomic_int park_asked;     /* the watcher has asked the main thread to park */
static volatile pid_t owner;      /* the process whose watcher listens */
static unsigned long main_ident;  /* PyThread_get_thread_ident() of the main thread */
static pthread_t main_thread;     /* the same, for the signal handler */
/* CPython 3.10-3.12 set the eval breaker for a pending call only when the thread that adds it
 * is the main thread: the watcher's park would be noticed only when the main thread next takes
 * the GIL back. What CPython's own signal handler calls (async-signal-safe), called by this
 * handler on the main thread once the park is asked for, makes it look at once. Looked up at
 * run time; absent elsewhere (then the main thread parks when it next takes the GIL). */
typedef void (*signal_received_fn)(PyInterpreterState *);
static signal_received_fn signal_received;
static PyInterpreterState *main_interp;
static int wake[2] = {-1, -1};
static int asked[2] = {-1, -1};   /* the watcher's word to the handler: the park is asked for */
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
        if (write(wake[1], &byte, 1) != 1) {
            default_action_now();
        } else if (pthread_equal(pthread_self(), main_thread)) {
            /* the main thread returns to Python only once its park is asked for (or after
             * 200 ms, should the watcher wait for a lock this thread holds) */
            struct pollfd ready = {asked[0], POLLIN, 0};
            int left = 200;
            double until = 0.0;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            until = (double)ts.tv_sec + ts.tv_nsec / 1e9 + 0.2;
            while (!atomic_load(&park_asked) && left > 0) {
                if (poll(&ready, 1, left) > 0)
                    break;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                left = (int)((until - ((double)ts.tv_sec + ts.tv_nsec / 1e9)) * 1000.0);
            }
            if (atomic_load(&park_asked) && signal_received != NULL && main_interp != NULL)
                signal_received(main_interp);   /* on this thread: it looks at once */
        }
    }
    errno = saved;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The main thread, with the GIL: give it up and sleep until the watcher ends the process. */
static void park_now(void) {
    Py_BEGIN_ALLOW_THREADS
    for (;;)
        pause();
    Py_END_ALLOW_THREADS
}

/* The pending call the watcher asks for: runs in the main thread at a bytecode boundary. */
static int park(void *unused) {
    (void)unused;
    if (owner != getpid())
        return 0;
    if (atomic_load(&holding) > 0) {
        atomic_store(&park_wanted, 1);      /* parked where the outermost section ends */
        return 0;
    }
    park_now();
    return 0;
}

static void ask_to_park(void) {
    struct timespec tick = {0, 1000 * 1000};
    for (int tries = 0; tries < 200; tries++) {     /* a full queue of pending calls: retry */
        if (Py_AddPendingCall(park, NULL) == 0)
            break;
        nanosleep(&tick, NULL);
    }
    atomic_store(&park_asked, 1);
    char byte = 1;
    ssize_t ignored = write(asked[1], &byte, 1);
    (void)ignored;
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
    ask_to_park();
    struct timespec tick = {0, 20 * 1000 * 1000};
    int said = 0, stalled = 0;
    long last = atomic_load(&progress);
    double since = now(), handed = now();
    /* a stop() handing its step over: its step counts (bounded by the stall time) */
    while (atomic_load(&handing) > 0 && now() - handed <= stall_seconds)
        nanosleep(&tick, NULL);
    /* every step handed to a writer by now: the main thread is parked (or hung in C), so
     * no more come, except from a stop() already handing over */
    while (atomic_load(&finished) < atomic_load(&queued) || atomic_load(&handing) > 0) {
        if (!said && atomic_load(&finished) < atomic_load(&queued)) {
            said = 1;
            say("precdbg: SIGTERM: training does not go on; writing the stopped steps before the "
                "process ends (send SIGTERM again to end it now)\n");
        }
        nanosleep(&tick, NULL);
        long seen = atomic_load(&progress);
        if (seen != last) {
            last = seen;
            since = now();
        } else if (now() - since > stall_seconds) {
            stalled = 1;
            say("precdbg: SIGTERM: the writer made no progress; ending the process "
                "(the step being written stays a .partial, which is never read as a step)\n");
            break;
        }
    }
    if (atomic_load(&capturing) > 0) {
        char step[48] = "a step";
        long number = atomic_load(&captured_step);
        if (number >= 0 && atomic_load(&capturing) == 1)
            snprintf(step, sizeof step, "step %ld", number);
        char line[400];             /* one write: one line (a thread, not the handler) */
        snprintf(line, sizeof line, "precdbg: SIGTERM while %s was being captured (start() "
                 "ran, stop() had not): it is not written%s\n", step, stalled ? "" :
                 " (what was written of it stays a .partial, which is never read as a step); "
                 "the steps stopped before it are written");
        say(line);
    }
    default_action_now();
    return NULL;
}

static void close_pipes(void) {
    for (int i = 0; i < 2; i++) {
        if (wake[i] >= 0)
            close(wake[i]);
        if (asked[i] >= 0)
            close(asked[i]);
        wake[i] = asked[i] = -1;
    }
}

static PyObject *install(PyObject *self, PyObject *args) {
    double stall;
    unsigned long ident = 0;
    struct sigaction current, ours;
    pthread_t thread;
    pthread_attr_t attr;
    sigset_t all, before;
    (void)self;
    if (!PyArg_ParseTuple(args, "d|k", &stall, &ident))
        return NULL;
    if (owner == getpid())
        Py_RETURN_TRUE;                     /* installed already in this process */
    if (sigaction(SIGTERM, NULL, &current) != 0)
        Py_RETURN_FALSE;
    if (current.sa_handler != on_sigterm &&
        ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL))
        Py_RETURN_FALSE;                    /* somebody's own handler, or SIGTERM ignored */
    close_pipes();                          /* the parent's pipes, inherited through fork */
    if (pipe(wake) != 0)
        Py_RETURN_FALSE;
    if (pipe(asked) != 0) {
        close_pipes();
        Py_RETURN_FALSE;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(wake[i], F_SETFD, FD_CLOEXEC);
        fcntl(asked[i], F_SETFD, FD_CLOEXEC);
    }
    fcntl(asked[0], F_SETFL, O_NONBLOCK);
    stall_seconds = stall;
    main_ident = ident ? ident : PyThread_get_thread_ident();
    main_thread = (pthread_t)main_ident;    /* CPython's thread ident is pthread_self() */
    main_interp = PyInterpreterState_Main();
#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030D0000
    signal_received = (signal_received_fn)dlsym(RTLD_DEFAULT, "_PyEval_SignalReceived");
#endif
    atomic_store(&terminating, 0);          /* a forked child counts its own steps only */
    atomic_store(&park_asked, 0);
    atomic_store(&park_wanted, 0);
    atomic_store(&queued, 0);
    atomic_store(&finished, 0);
    atomic_store(&handing, 0);
    atomic_store(&holding, 0);
    sigfillset(&all);                       /* the watcher never takes a signal itself */
    pthread_sigmask(SIG_SETMASK, &all, &before);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);   /* it only reads, sleeps and counts */
    int failed = pthread_create(&thread, &attr, watch, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (failed) {
        close_pipes();
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
    long step = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "i|l", &delta, &step))
        return NULL;
    if (delta > 0)
        atomic_store(&captured_step, step);
    atomic_fetch_add(&capturing, delta);
    Py_RETURN_NONE;
}

static int on_main_thread(void) {
    return owner == getpid() && PyThread_get_thread_ident() == main_ident;
}

/* A section where the main thread is not parked (precdbg's code holding a lock the writer
 * needs): a park asked for inside happens where the outermost one ends. */
static void hold_delta(int delta) {
    if (!on_main_thread())
        return;
    if (atomic_fetch_add(&holding, delta) + delta <= 0) {
        atomic_store(&holding, 0);
        if (atomic_exchange(&park_wanted, 0))
            park_now();
    }
}

static PyObject *hold(PyObject *self, PyObject *args) {
    int delta;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &delta))
        return NULL;
    hold_delta(delta);
    Py_RETURN_NONE;
}

static PyObject *hand_over(PyObject *self, PyObject *args) {
    int delta;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &delta))
        return NULL;
    atomic_fetch_add(&handing, delta);  /* at the end: counted off before a park here */
    hold_delta(delta);
    Py_RETURN_NONE;
}

static PyObject *counts(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return Py_BuildValue("{s:l,s:l,s:l,s:l,s:l,s:i,s:O}", "queued", atomic_load(&queued),
                         "finished", atomic_load(&finished), "capturing",
                         atomic_load(&capturing), "handing", atomic_load(&handing),
                         "holding", atomic_load(&holding), "main", on_main_thread(),
                         "nudge", signal_received != NULL ? Py_True : Py_False);
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
     "install(stall_seconds, main_thread_ident=0) -> bool: on SIGTERM, park the main thread "
     "and write the stopped steps before the process ends"},
    {"hold", hold, METH_VARARGS,
     "hold(+1 | -1): the main thread enters or leaves a section where it is not parked"},
    {"hand_over", hand_over, METH_VARARGS,
     "hand_over(+1 | -1): a stop() begins or ends handing its step to a writer (a SIGTERM "
     "waits for it; the main thread is not parked inside)"},
    {"note_queued", note_queued, METH_NOARGS, "a stopped step was handed to a writer"},
    {"note_finished", note_finished, METH_NOARGS, "a stopped step was written or given up"},
    {"note_progress", note_progress, METH_NOARGS, "a writer wrote something"},
    {"note_capturing", note_capturing, METH_VARARGS,
     "note_capturing(+1 | -1[, step]): a capture window (of that step) opened or closed"},
    {"counts", counts, METH_NOARGS, "what the watcher counts, for tests"},
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
