"""A training script written as the msprobe / MindSpeed accuracy guides show it: the debugger is
a local of main(), start()/stop()/step() around the dumped steps, and no close(). Each VARIANT
ends the process a different way (tests/test_exit.py runs it in real subprocesses).

    python tests/exit_guide.py FRAMEWORK VARIANT CONFIG_JSON
FRAMEWORK: torch | mindspore; VARIANT: see `_end_of_step` and `main`.
Prints "stopped <iteration>" after each stop() so a parent can time a signal.
"""
import gc
import os
import signal
import sys
import threading
import time

FRAMEWORK, VARIANT, CONFIG = sys.argv[1], sys.argv[2], sys.argv[3]
TINY = dict(n_layer=2, d_model=32, n_head=2, seq_len=8, vocab_size=64)
DUMP_STEPS = {"local": [0, 2], "sys_exit": [0, 1, 2], "exception": [0, 1, 2],
              "keyboard_interrupt": [0, 1, 2], "gc_exit": [0, 1, 2], "gc_retire": [0, 1, 2],
              "sigterm": list(range(200)), "torchrun": [0, 2], "os_exit": [0, 1, 2]}[VARIANT]
ITERATIONS = {"sigterm": 200}.get(VARIANT, 4)


def build_torch():
    import torch
    from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
    from precdbg_pt import PrecisionDebugger
    torch.manual_seed(0)
    cfg = GPTConfig(**TINY)
    model = GPT(cfg)
    if VARIANT == "torchrun":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = list(make_batches(cfg, batch_size=2, steps=4, seed=0))

    def train(i):
        x, y = batches[i % len(batches)]
        return train_step(model, opt, x, y)

    def fail_in_forward(i):
        """A user's bug inside the model's forward, on iteration i."""
        def hook(module, args):
            if state["iteration"] == i:
                raise RuntimeError("boom in forward")
        inner = model.module if hasattr(model, "module") else model
        inner.blocks[1].register_forward_pre_hook(hook)
    return model, train, fail_in_forward, PrecisionDebugger


def build_mindspore():
    import mindspore as ms
    from mindspore import nn
    from precdbg_examples import gpt_ms
    from precdbg_ms import PrecisionDebugger
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    cfg = gpt_ms.GPTConfig(**TINY)
    model = gpt_ms.GPT(cfg)
    opt = nn.AdamWeightDecay(model.trainable_params(), learning_rate=1e-3)
    step_fn = gpt_ms.train_step_fn(model, opt)
    batches = list(gpt_ms.make_batches(cfg, batch_size=2, steps=4, seed=0))

    def train(i):
        x, y = batches[i % len(batches)]
        return step_fn(x, y)

    def fail_in_forward(i):
        def hook(cell, args):
            if state["iteration"] == i:
                raise RuntimeError("boom in forward")
        model.blocks[1].register_forward_pre_hook(hook)
    return model, train, fail_in_forward, PrecisionDebugger


state = {"iteration": -1}


def _end_mid_step(i):
    """Called between start() and stop() of iteration i: end the process as the variant says."""
    if i != 2:
        return
    if VARIANT == "sys_exit":
        sys.exit(3)
    if VARIANT == "keyboard_interrupt":
        os.kill(os.getpid(), signal.SIGINT)     # a real Ctrl-C: raised wherever Python is next
        time.sleep(5)


def run_dump():
    """The guides' four lines; the debugger is a local and is never closed."""
    build = build_torch if FRAMEWORK == "torch" else build_mindspore
    model, train, fail_in_forward, PrecisionDebugger = build()
    if VARIANT == "exception":
        fail_in_forward(2)
    debugger = PrecisionDebugger(config_path=CONFIG)
    for i in range(ITERATIONS):
        state["iteration"] = i
        if i in DUMP_STEPS:
            debugger.start(model)
        train(i)
        if i in DUMP_STEPS:
            _end_mid_step(i)
            debugger.stop()
            debugger.step()
            print(f"stopped {i}", flush=True)


def main():
    run_dump()
    if VARIANT == "os_exit":             # skips every shutdown hook (a distributed script's way
        os._exit(5)                      # around a teardown that may hang)
    if VARIANT in ("gc_exit", "gc_retire"):
        gc.collect()                     # the debugger is gone; its writer may still be busy
    if VARIANT == "gc_retire":
        deadline = time.time() + 60
        while time.time() < deadline and any(t.name == "precdbg-writer"
                                              for t in threading.enumerate()):
            time.sleep(0.05)
        alive = any(t.name == "precdbg-writer" for t in threading.enumerate())
        print(f"writer alive after gc: {alive}", flush=True)
    if VARIANT == "torchrun":
        # as torch.distributed's docs require at the end of a script
        import torch.distributed as dist
        dist.destroy_process_group()
        # A torch teardown race, with or without precdbg: DDP keeps gloo's process group (and its
        # worker threads) alive past destroy_process_group(), and a worker that frees a finished
        # allreduce releases the Python contextvars.Context its ThreadLocalState holds. Doing so
        # during interpreter finalisation, it cannot take the GIL and the process aborts
        # ("terminate called without an active exception"; core dumps: ~AsyncAllreduceWork ->
        # ~ThreadLocalState -> SafePyObject decref -> take_gil -> pthread_exit). Reproduced on
        # this machine in 1 of 82 two-rank runs without precdbg (a dummy debugger). Letting the
        # workers finish first keeps this test about precdbg's own exit path.
        time.sleep(0.5)
    print("main done", flush=True)


if __name__ == "__main__":
    main()
