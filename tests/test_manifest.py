"""The run manifest in run.json: versions, determinism, optimizers with their param groups,
LR schedulers, the AMP loss scale; secrets never recorded; class wrappers removed at stop()."""
import json

import torch

from precdbg.records.environment import environment_allowlisted, looks_secret
from precdbg_pt import PrecisionDebugger, seed_all


def _run(tmp_path, steps=2):
    seed_all(11)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"))
    for _ in range(steps):
        dbg.start(model)
        loss = model(torch.randn(3, 4)).square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()
        dbg.stop()
        dbg.step()
    dbg.close()
    assert dbg.failures == 0
    with open(tmp_path / "d" / "run.json", encoding="utf-8") as handle:
        return json.load(handle)["manifest"]


def test_manifest_records_set_up(tmp_path):
    man = _run(tmp_path)
    assert man["versions"]["torch"] == torch.__version__ and man["versions"]["numpy"]
    assert man["device"] == {"kind": "cpu", "count": 1}
    assert man["rank"] == 0 and man["world_size"] == 1
    assert man["seed_all"] == {"seed": 11, "deterministic": True}
    assert man["determinism"]["deterministic_algorithms"] is True
    assert man["determinism"]["initial_seed"] == 11
    (opt,) = man["optimizers"]
    assert opt["class"] == "AdamW"
    groups = opt["param_groups"]
    assert [g["hyper"]["weight_decay"] for g in groups] == [0.1, 0.0]
    assert groups[0]["params"] == ["0.weight", "1.weight", "2.weight"]
    assert groups[1]["params"] == ["0.bias", "1.bias", "2.bias"]
    assert groups[0]["hyper"]["lr"] == 1e-2 * 0.5          # after the first scheduler step
    (sched,) = man["lr_schedulers"]
    assert sched["class"] == "StepLR" and sched["last_epoch"] == 2
    assert sched["last_lr"] == [1e-2 * 0.25, 1e-2 * 0.25]
    assert man["loss_scale"]["class"] == "GradScaler" and man["loss_scale"]["scale"] > 0
    torch.use_deterministic_algorithms(False)


def test_wrappers_are_removed_after_stop(tmp_path):
    update = torch.amp.GradScaler.__dict__["update"]
    step = torch.optim.lr_scheduler.LRScheduler.__dict__["step"]
    _run(tmp_path, steps=1)
    assert torch.amp.GradScaler.__dict__["update"] is update
    assert torch.optim.lr_scheduler.LRScheduler.__dict__["step"] is step
    torch.use_deterministic_algorithms(False)


def test_secret_looking_values_are_never_recorded():
    env = {"HCCL_ALGO": "ghp_1234567890abcdefABCDEF123456", "OMP_NUM_THREADS": "2",
           "AWS_SECRET_ACCESS_KEY": "abc", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
           "MS_ALLOC_CONF": "sk-abcdefghijklmnopqrstuvwxyz0123"}
    out = environment_allowlisted(env)
    assert out == {"HCCL_ALGO": "<redacted>", "OMP_NUM_THREADS": "2",
                   "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "MS_ALLOC_CONF": "<redacted>"}
    assert looks_secret("MY_API_KEY", "x") and looks_secret("X", "AKIAABCDEFGHIJKLMNOP")
    assert not looks_secret("HCCL_DETERMINISTIC", "true")


def test_first_batch_in_manifest(tmp_path):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    model = torch.nn.Linear(4, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), step=[1])
    for _ in range(3):
        dbg.start(model)
        model(x).sum().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    with open(tmp_path / "d" / "run.json", encoding="utf-8") as handle:
        first = json.load(handle)["manifest"]["first_batch"]
    assert first["step"] == 1
    (t,) = first["tensors"]
    assert t["shape"] == [3, 4] and t["dtype"] == "float32"
    assert t["min"] == 0.0 and t["max"] == 11.0 and abs(t["mean"] - 5.5) < 1e-12
    import xxhash
    assert t["checksum"] == xxhash.xxh3_64_hexdigest(x.numpy().tobytes())
