"""A small CNN trained as the accuracy guides show it (PrecisionDebugger(config_path=...),
start(model) / stop() / step() around iteration 1 only), run in a real process by
tests/test_order_stats.py. With FLIP "flip", one image of the batch is flipped horizontally
(torch.flip on its last dimension) before the model reads it: the same values in another order,
which min, max, mean and norm cannot see and pos_mean does.

    python tests/flip_guide.py CONFIG_JSON {clean|flip}
"""
import sys

import torch

from cnn_support import CLASSES, torch_model

CONFIG, FLIP = sys.argv[1], sys.argv[2]
ITERATIONS, DUMPED = 3, 1


def main() -> None:
    from precdbg_pt import PrecisionDebugger
    torch.manual_seed(0)
    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 8, 8, generator=generator),
                torch.randint(0, CLASSES, (4,), generator=generator)) for _ in range(ITERATIONS)]
    debugger = PrecisionDebugger(config_path=CONFIG)
    for i, (x, y) in enumerate(batches):
        if FLIP == "flip" and i == DUMPED:
            x = x.clone()
            x[2] = torch.flip(x[2], dims=[-1])
        if i == DUMPED:
            debugger.start(model)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i == DUMPED:
            debugger.stop()
            debugger.step()
    print("done", flush=True)


if __name__ == "__main__":
    main()
