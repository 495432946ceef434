"""Where a training step's time goes, for the node benchmarks (issue 45).

A rank below its ceiling with no wait for data is slowed beside the loader,
not starved; two causes look alike from the outside:
  - the host queues the step too slowly (the Python thread that launches the
    model's kernels shares the cores with the loader's threads): the GPU
    idles between kernels and the host's queueing time per step reaches the
    step's time;
  - the GPU runs the model's kernels more slowly (decode kernels beside them,
    memory traffic): the GPU's time per step grows while the host's stays.
StepClock measures both, per epoch: the host's seconds from the start of a
step to the return of its last call (forward, backward, optimizer: nothing
synchronizes), and on every `every`-th step the GPU's seconds between two
CUDA events recorded around it on the current stream. Compare each with the
same job's ceiling (the model on batches already on the GPU).

    clock = StepClock(torch, dev)
    for x, y in loader:
        clock.begin(); loss = step(x, y); clock.end()
    summary = clock.epoch()   # {"steps", "host_queue_ms", "gpu_step_ms", "wall_step_ms"}
"""
import time


class StepClock:
    def __init__(self, torch, dev, every=8):
        self.torch = torch
        self.cuda = getattr(dev, "type", str(dev)) == "cuda"
        self.every = max(1, int(every))
        self._reset()

    def _reset(self):
        self.steps = 0
        self.host = 0.0
        self.pending = []  # (start event, end event)
        self.first = None
        self.last = None
        self.t0 = None
        self.ev = None

    def begin(self):
        self.t0 = time.perf_counter()
        if self.first is None:
            self.first = self.t0
        self.ev = None
        if self.cuda and self.steps % self.every == 0:
            self.ev = self.torch.cuda.Event(enable_timing=True)
            self.ev.record()

    def end(self):
        t = time.perf_counter()
        self.host += t - self.t0
        self.last = t
        if self.ev is not None:
            end = self.torch.cuda.Event(enable_timing=True)
            end.record()
            self.pending.append((self.ev, end))
        self.steps += 1

    def epoch(self):
        """The epoch's means (milliseconds), and a fresh clock for the next."""
        if self.cuda:
            self.torch.cuda.synchronize()
        gpu = [a.elapsed_time(b) for a, b in self.pending]
        n = max(1, self.steps)
        out = {
            "steps": self.steps,
            "host_queue_ms": 1e3 * self.host / n,
            "gpu_step_ms": sum(gpu) / len(gpu) if gpu else None,
            "wall_step_ms": (1e3 * (self.last - self.first) / max(1, self.steps - 1)
                             if self.steps > 1 else None),
        }
        self._reset()
        return out
