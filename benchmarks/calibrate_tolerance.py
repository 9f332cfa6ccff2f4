"""Noise between two dumps of the same training step, by the precision each record's values
carry (the `precision` column): the largest statistics error (relative differences of min, max,
mean, norm; what the compare's tolerance is held against) and, where both dumps hold tensors,
the largest relative RMSE. Used to calibrate precdbg/compare/judge/metrics.py's TOLERANCE.

    python benchmarks/calibrate_tolerance.py BASELINE CANDIDATE [--step S] [--show NAME_SUBSTRING]
"""
from __future__ import annotations

import argparse
import collections
import sys

import numpy as np

import precdbg
from precdbg.compare.align.alignment import align
from precdbg.compare.judge.metrics import stat_errors, tensor_metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--show", default=None)
    args = parser.parse_args(argv)
    da, db = precdbg.open_dump(args.a), precdbg.open_dump(args.b)
    ta, tb = da.records(args.step, 0), db.records(args.step, 0)
    same = da.run.get("framework") == db.run.get("framework")
    al = align(ta, tb, same)
    st = stat_errors(ta, tb, al.pairs_a, al.pairs_b)
    worst = collections.defaultdict(lambda: (0.0, ""))
    worst_rmse = collections.defaultdict(lambda: (0.0, ""))
    for p, (i, j) in enumerate(zip(al.pairs_a.tolist(), al.pairs_b.tolist())):
        if tb["dtype"][j].startswith("py.") or not np.isfinite(st["err"][p]):
            continue
        key = (str(tb["precision"][j]) or "?", str(tb["kind"][j]) == "param")
        name = f"{ta['entry'][i]} {ta['role'][i]} {ta['arg_index'][i]}"
        if st["err"][p] > worst[key][0]:
            worst[key] = (float(st["err"][p]), name)
        if ta["data_offset"][i] >= 0 and tb["data_offset"][j] >= 0:
            tm = tensor_metrics(da.tensor_at(ta, i), db.tensor_at(tb, j))
            if tm and tm["rel_rmse"] > worst_rmse[key][0]:
                worst_rmse[key] = (tm["rel_rmse"], name)
        if args.show and args.show in name:
            print(f"  {name}: err {st['err'][p]:.3g} tol {st['tol'][p]:.3g} precision "
                  f"{tb['precision'][j]} dtype {tb['dtype'][j]}")
    for key in sorted(worst):
        prec, param = key
        print(f"precision {prec:9s} {'param ' if param else 'tensor'} max stat err "
              f"{worst[key][0]:.3g} ({worst[key][1]}); max rel RMSE "
              f"{worst_rmse[key][0]:.3g} ({worst_rmse[key][1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
