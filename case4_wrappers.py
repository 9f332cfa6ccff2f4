# Case 4: WRAP env: toc (TrainOneStepCell(WithLossCell)) | model (Model.train + NumpySlicesDataset + callback)
import sys; sys.path.insert(0, "/tmp/sweep_ms")
from common import *
WRAP = os.environ.get("WRAP", "toc")
START = os.environ.get("START", "net")   # which object start() gets: net | wrapper
N, DUMP = 4, 1

class LossNet(nn.Cell):
    def __init__(self, net):
        super().__init__(); self.net = net
    def construct(self, x, y):
        return loss_cell(self.net(x).reshape(-1, VOCAB), y)

def main():
    if DBG:
        from precdbg_ms import PrecisionDebugger
        debugger = PrecisionDebugger(config_path="./config.json")
    net = make_net()
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3, weight_decay=0.01)
    losses, times = [], []
    data = batches(N)
    if WRAP == "toc":
        wl = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")) if False else LossNet(net)
        if os.environ.get("WLC") == "1":
            class Flat(nn.Cell):
                def __init__(self, n): super().__init__(); self.n = n
                def construct(self, x): return self.n(x).reshape(-1, VOCAB)
            wl = nn.WithLossCell(Flat(net), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        train = nn.TrainOneStepCell(wl, opt)
        train.set_train()
        target = {"net": net, "wrapper": train}[START]
        for step in range(N):
            x, y = data[step]
            t0 = time.perf_counter()
            if DBG and step == DUMP: debugger.start(target)
            loss = train(x, y)
            if DBG and step == DUMP: debugger.stop(); debugger.step()
            times.append(time.perf_counter() - t0)
            losses.append(loss.asnumpy())
    else:
        import mindspore.dataset as ds
        from mindspore.train import Model, Callback
        xs = np.stack([d[0].asnumpy() for d in data]).reshape(N * B, T)
        ys = np.stack([d[1].asnumpy() for d in data]).reshape(N * B, T)
        dset = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(B)
        class Flat(nn.Cell):
            def __init__(self, n): super().__init__(); self.n = n
            def construct(self, x): return self.n(x).reshape(-1, VOCAB)
        class L(nn.Cell):
            def __init__(self): super().__init__(); self.l = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
            def construct(self, logits, y): return self.l(logits, y.reshape(-1))
        model = Model(Flat(net), loss_fn=L(), optimizer=opt)
        class CB(Callback):
            def on_train_step_begin(self, rc):
                self.t0 = time.perf_counter()
                cur = rc.original_args().cur_step_num - 1
                if DBG and cur == DUMP: debugger.start(net)
            def on_train_step_end(self, rc):
                cur = rc.original_args().cur_step_num - 1
                if DBG and cur == DUMP: debugger.stop(); debugger.step()
                times.append(time.perf_counter() - self.t0)
                losses.append(rc.original_args().net_outputs.asnumpy())
        model.train(1, dset, callbacks=[CB()], dataset_sink_mode=False)
    save_results(net, losses, times)
main()
