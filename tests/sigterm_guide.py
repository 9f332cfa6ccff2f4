"""The guides' four lines, then a SIGTERM (a scheduler's, `timeout`'s, torchrun's) or a Ctrl-C
while the stopped step is still being written (tests/test_sigterm.py runs it).

    python tests/sigterm_guide.py FRAMEWORK VARIANT DUMP_PATH
FRAMEWORK: torch | mindspore. VARIANT, what happens right after stop() and step():
  self      the process sends itself SIGTERM, then goes on training (sleeps)
  ctrl_c    the process sends itself SIGINT (a Ctrl-C), then sleeps
  hog       prints "stopped" and holds the GIL in C (a regex that backtracks for ages): the
            writer cannot progress; the parent sends the signals
  handler   the script's own SIGTERM handler (installed first) ends it with sys.exit(7)
  fork      forks a child that sleeps; prints the child's pid; the parent sends it SIGTERM and
            the script reports how the child ended
  inside    the process sends itself SIGTERM after start() and the step, before stop()
The dumped step is the tensor task of a ~90 MB step: writing it takes a while.
"""
import os
import re
import signal
import sys
import time

FRAMEWORK, VARIANT, DUMP = sys.argv[1], sys.argv[2], sys.argv[3]


def build_torch():
    import torch
    from precdbg_pt import PrecisionDebugger
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 1024)

    def train():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, train, PrecisionDebugger


def build_mindspore():
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    from precdbg_ms import PrecisionDebugger
    ms.set_device("CPU")
    ms.set_seed(0)
    model = nn.SequentialCell(nn.Dense(1024, 4096), nn.ReLU(), nn.Dense(4096, 1024))
    opt = nn.SGD(model.trainable_params(), learning_rate=0.1)
    grad_fn = ms.value_and_grad(lambda x: (model(x) ** 2).mean(), None, opt.parameters)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((256, 1024), dtype=np.float32))

    def train():
        _, grads = grad_fn(x)
        opt(grads)
    return model, train, PrecisionDebugger


def after_stop() -> None:
    if VARIANT == "self":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(120)
    elif VARIANT == "ctrl_c":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(120)
    elif VARIANT == "hog":
        hog = re.compile(r"(a+)+$")     # compiled first: the Python code of re runs before
        print("stopped", flush=True)
        hog.match("a" * 64 + "b")
    elif VARIANT == "handler":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(120)
    elif VARIANT == "fork":
        child = os.fork()
        if child == 0:
            time.sleep(120)
            os._exit(0)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        print(f"child ended by signal {os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0}",
              flush=True)


def main() -> None:
    if VARIANT == "handler":
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
    if "STALL" in os.environ:
        import precdbg.storage.process_exit
        precdbg.storage.process_exit._SIGTERM_STALL_SECONDS = float(os.environ["STALL"])
    model, train, PrecisionDebugger = (build_torch if FRAMEWORK == "torch" else build_mindspore)()
    debugger = PrecisionDebugger(task="tensor", level="mix", dump_path=DUMP)
    for step in range(3):
        if step == 1:
            debugger.start(model)
        train()
        if step == 1 and VARIANT == "inside":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(120)
        if step == 1:
            debugger.stop()
            debugger.step()
            after_stop()
    print("main done", flush=True)


if __name__ == "__main__":
    main()
