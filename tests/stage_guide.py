"""The guides' four lines on every iteration, and one way of ending the process at one stage
boundary of iteration 1 (tests/test_kill_stages.py and scripts/kill_stages.py run it).

    python tests/stage_guide.py KIND STAGE DUMP_PATH
KIND, what happens at the stage:
  sigkill    the process sends itself SIGKILL
  sigterm    the process sends itself SIGTERM (as a scheduler, `timeout` or torchrun would)
  exception  an exception: the user's RuntimeError in the user's code (capture, after_step),
             a Ctrl-C (KeyboardInterrupt) inside precdbg's start()/stop(), and, at the
             writer's stages, a Ctrl-C in the main thread while the writer is there
  peer       run under torchrun (gloo DDP): rank 1 sends itself SIGKILL at the stage, the other
             ranks end however torchrun and the dead peer make them
STAGE, in iteration 1 (step 1):
  start       inside start(), before the step is opened
  capture     between forward and backward (the user's code, a capture window open)
  stop_before inside stop(), before the step is handed to the writer
  stop_after  inside stop(), right after the step is handed to the writer
  writing     the writer's thread, as it begins to finish the step file (before the rename)
  renaming    the writer's thread, the step file renamed, its folder not yet fsynced
              (at both, iteration 2's capture window waits in the user's code until then)
  after_step  right after step() returned
  queue       inside the writer's queue lock, as iteration 1's records are queued (the main
              thread must not be parked holding it: the writer could never finish)
Each line on stdout is one event: `iter I`, `optimizer I` (after the optimizer's step),
`stopped I` (after stop() and step()), `fired STAGE` (just before the stage's event).
"""
import _thread
import collections
import os
import signal
import sys
import threading
import time

KIND, STAGE, DUMP = sys.argv[1], sys.argv[2], sys.argv[3]
ITERATIONS, AT = 4, 1
RANK = int(os.environ.get("RANK", "0"))
state = {"iteration": -1, "fired": False}


def say(text: str) -> None:
    os.write(1, (text + "\n").encode())      # one write: lines of two threads never mix


def fire(stage: str, in_writer: bool = False) -> None:
    if state["fired"] or (KIND == "peer" and RANK != 1):
        return
    if not in_writer and state["iteration"] != AT:      # (the writer's: step AT's file)
        return
    state["fired"] = True
    say(f"fired {stage}")
    if KIND in ("sigkill", "peer"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif KIND == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif in_writer:
        _thread.interrupt_main()             # a Ctrl-C while the writer is at this stage
        time.sleep(0.2)
    elif stage in ("capture", "after_step"):
        raise RuntimeError(f"the user's error at {stage}")
    else:
        raise KeyboardInterrupt              # a Ctrl-C inside precdbg's own code


def patch_stages() -> None:
    """Fire at precdbg's inner boundaries (the same functions, called at the same moments)."""
    from precdbg.storage import step_file, writer

    real_open, real_close = writer.DumpWriter.open_step, writer.DumpWriter.close_step
    real_finish, real_replace = step_file.OpenStep.finish, step_file.os.replace

    def open_step(self, step, rank, attrs):
        if STAGE == "start":
            fire("start")
        return real_open(self, step, rank, attrs)

    def close_step(self, *args, **kwargs):
        if STAGE == "stop_before":
            fire("stop_before")
        real_close(self, *args, **kwargs)
        if STAGE == "stop_after":
            fire("stop_after")

    def finish(self, *args, **kwargs):
        if STAGE == "writing" and self.attrs.get("step") == AT:
            fire("writing", in_writer=True)
        return real_finish(self, *args, **kwargs)

    class ReplaceThenFire:
        """step_file's `os`, with a replace that fires once step AT's file is renamed."""
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def replace(src, dst):
            real_replace(src, dst)
            if STAGE == "renaming" and os.path.basename(os.path.dirname(dst)) == f"step{AT}":
                fire("renaming", in_writer=True)

    class FiringQueue(collections.deque):
        """The writer's queue: fires as a batch of step AT goes in, under the queue's lock."""
        def append(self, item):
            super().append(item)
            if STAGE == "queue" and item[0] == "batch":
                fire("queue")

    real_init = writer.DumpWriter.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._items = FiringQueue()

    writer.DumpWriter.__init__ = init
    writer.DumpWriter.open_step, writer.DumpWriter.close_step = open_step, close_step
    step_file.OpenStep.finish = finish
    step_file.os = ReplaceThenFire()


def main() -> None:
    import torch
    from precdbg_pt import PrecisionDebugger
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    if KIND == "peer":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    patch_stages()
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=DUMP)
    for i in range(ITERATIONS):
        state["iteration"] = i
        say(f"iter {i}")
        debugger.start(model)
        loss = model(x).square().mean()
        if STAGE == "capture":
            fire("capture")
        if STAGE in ("writing", "renaming") and i == AT + 1:
            deadline = time.time() + 60      # training goes on while the writer is there
            while not state["fired"] and time.time() < deadline:
                time.sleep(0.005)
        loss.backward()
        opt.step()
        say(f"optimizer {i}")
        opt.zero_grad()
        debugger.stop()
        debugger.step()
        say(f"stopped {i}")
        if STAGE == "after_step":
            fire("after_step")
    say("main done")
    if KIND == "peer":
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
