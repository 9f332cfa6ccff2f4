"""A compare held per (step, rank) (issue 50): rows spooled to disk give the JSON, CSV, summary
and HTML data of the list they replace, one process or workers; a rank file that cannot be read
among many is named in one line and the others are compared (exit 3 where nothing else
differs, 1 where something does); a rank one side lacks is said."""
from __future__ import annotations

import csv
import io
import json
import os
from decimal import Decimal

import pytest

import synthetic as S
from precdbg.cli import main
from precdbg.compare import compare_dumps, parallel
from precdbg.compare.report.formats import summary_text, write_csv, write_json
from precdbg.compare.report.html import page_data
from precdbg.compare.report.row_store import RowChunk, RowFacts, RowStore, make_chunk
from row_reference import columns_of_rows, facts_of_rows
from precdbg.compare.judge.rows import NoteCode, Row

RANKS = (0, 1, 2, 3, 4, 5)


@pytest.fixture(autouse=True)
def small_dumps_in_parallel(monkeypatch):
    monkeypatch.setattr(parallel, "_MIN_PARALLEL_BYTES", 0)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("streaming")
    base = dict(ranks=RANKS, steps=(0, 1))
    return (S.write_dump(root / "a", **base),
            S.write_dump(root / "b", **dict(base, gelu_scale=1.01)),
            S.write_dump(root / "c", **base))


def _truncate(path: str) -> None:
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data[:len(data) // 2])


def _files(tmp_path, result, name):
    json_path, csv_path = tmp_path / f"{name}.json", tmp_path / f"{name}.csv"
    write_json(result, str(json_path))
    write_csv(result, str(csv_path))
    return json_path.read_bytes(), csv_path.read_bytes()


@pytest.mark.parametrize("other", [1, 2])
@pytest.mark.parametrize("jobs", [1, 2])
def test_spooled_rows_give_the_same_reports(dumps, tmp_path, other, jobs):
    a, b = dumps[0], dumps[other]
    listed = compare_dumps(a, b, jobs=1)
    spooled = compare_dumps(a, b, jobs=jobs, spool_rows=True)
    assert isinstance(spooled["rows"], RowStore) and isinstance(listed["rows"], list)
    assert len(spooled["rows"]) == len(listed["rows"]) > 0
    assert list(spooled["rows"]) == listed["rows"]
    assert _files(tmp_path, spooled, "s") == _files(tmp_path, listed, "l")
    assert json.loads((tmp_path / "s.json").read_text()) == \
        json.loads(json.dumps(listed, default=str))
    assert summary_text(spooled) == summary_text(listed)
    spooled_page, listed_page = page_data(spooled), page_data(listed)
    assert spooled_page == listed_page
    assert listed["verdict"] == ("diverged" if other == 1 else "match")


def test_store_reads_chunks_back_in_step_rank_order():
    def rows(step, rank, n, status="match"):
        return [Row(step, rank, f"e{step}.{rank}.{k}", f"e{step}.{rank}.{k}", "api", "forward",
                    "m", "op", "output", k, "float32", "float32", [2], [2], k, k, status)
                for k in range(n)]
    for spool in (False, True):
        store = RowStore(spool=spool)
        # arrival order of workers: not (step, rank) order
        for step, rank, n, status in ((1, 0, 2, "match"), (0, 1, 3, "precision"),
                                      (0, 0, 1, "diverged"), (1, 1, 0, "match")):
            chunk_rows = rows(step, rank, n, status)
            store.add(make_chunk(step, rank, facts_of_rows(chunk_rows),
                                  columns_of_rows(chunk_rows), spool))
        names = [r["name_a"] for r in store]
        assert names == ["e0.0.0", "e0.1.0", "e0.1.1", "e0.1.2", "e1.0.0", "e1.0.1"]
        facts = store.facts()
        assert (facts.count, facts.diverged, facts.explained) == (6, 1, 3)
        assert facts.explained_first == "e0.1.0"
        assert len(store) == 6
        store.close()
    assert RowFacts().then(facts_of_rows([])) == RowFacts()
    assert RowChunk(0, 0, RowFacts()).dicts is None


@pytest.mark.parametrize("jobs", [1, 2])
def test_one_unreadable_rank_among_many_is_named_and_the_rest_compared(
        tmp_path, capsys, jobs):
    base = dict(ranks=RANKS, steps=(0, 1))
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **base)
    whole = compare_dumps(a, b, jobs=1)
    damaged = os.path.join(b, "step1", "rank3.h5")
    _truncate(damaged)
    checked = os.path.join(a, "step0", "rank0.h5")     # the rank `check` reads first
    _truncate(checked)
    result = compare_dumps(a, b, jobs=jobs, spool_rows=True)
    assert result["verdict"] == "incomplete"
    unreadable = [p for p in result["incomplete"] if p["why"] == "unreadable"]
    assert [(p["step"], p["rank"], p["side"]) for p in unreadable] == \
        [(0, 0, "baseline"), (1, 3, "candidate")]
    assert damaged in unreadable[1]["error"] and checked in unreadable[0]["error"]
    per_pair = len(whole["rows"]) // (2 * len(RANKS))
    assert len(result["rows"]) == len(whole["rows"]) - 2 * per_pair
    codes = [n["code"] for n in result["notes"]]
    assert codes.count(NoteCode.STEP_UNREAD.value) == 2
    # the command: exit 3, each file named on one line of the summary
    out = tmp_path / "r.json"
    assert main(["compare", a, b, "--jobs", str(jobs), "--json", str(out)]) == 3
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if "not compared, a file cannot be read" in line]
    assert len(lines) == 2 and checked in lines[0] and damaged in lines[1]
    # --allow-missing does not make damage a match
    assert main(["compare", a, b, "--allow-missing"]) == 3


def test_unreadable_rank_besides_a_divergence(tmp_path, capsys):
    base = dict(ranks=RANKS, steps=(0,))
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **dict(base, gelu_scale=1.01))
    damaged = os.path.join(b, "step0", "rank5.h5")
    _truncate(damaged)
    assert main(["compare", a, b]) == 1
    text = capsys.readouterr().out
    assert sum(damaged in line for line in text.splitlines()) == 1
    result = compare_dumps(a, b)
    assert result["first_divergence"]["rank"] != 5
    assert {row["rank"] for row in result["rows"]} == set(RANKS) - {5}


def test_rank_missing_on_one_side_is_said(tmp_path, capsys):
    base = dict(ranks=RANKS, steps=(0,))
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **base)
    os.remove(os.path.join(b, "step0", "rank2.h5"))
    for jobs in ("1", "2"):
        assert main(["compare", a, b, "--jobs", jobs]) == 3
        text = capsys.readouterr().out
        assert "step 0 rank 2: only in the baseline" in text
    result = compare_dumps(a, b)
    assert {(p["step"], p["rank"], p["why"]) for p in result["incomplete"]} == \
        {(0, 2, "only_here")}


def test_csv_of_spooled_rows_reads_back(dumps, tmp_path):
    result = compare_dumps(dumps[0], dumps[1], spool_rows=True)
    path = tmp_path / "r.csv"
    write_csv(result, str(path))
    table = list(csv.DictReader(io.StringIO(path.read_text())))
    assert len(table) == len(result["rows"])
    assert {row["status"] for row in table} >= {"diverged"}


def test_files_released_per_step_and_rank_read_again(tmp_path):
    """A compare closes each (step, rank)'s files once compared; what reads them later (the
    verdict's call site, a tensor) opens them again, relabelled files under their label."""
    from precdbg.storage.reader import open_dump
    a = S.write_dump(tmp_path / "a", ranks=(0, 1), steps=(0,), task="tensor")
    dump = open_dump(a)
    try:
        table = dump.records(0, 1)
        stored = [i for i in range(len(table)) if table["data_offset"][i] >= 0]
        first = dump.tensor_at(table, stored[0]).copy()
        dump.release(0, 1)
        assert all(f._file is None for f in dump.files(0, 1))
        assert (dump.tensor_at(dump.records(0, 1), stored[0]) == first).all()
    finally:
        dump.close()
    # two named files of different ranks: compared under the baseline's numbers, released,
    # read again for the report
    b = S.write_dump(tmp_path / "b", ranks=(0, 1), steps=(0,), task="tensor",
                     gelu_scale=1.01)
    one = compare_dumps(os.path.join(a, "step0", "rank0.h5"),
                        os.path.join(b, "step0", "rank1.h5"))
    assert one["verdict"] == "diverged" and one["first_divergence"]["rank"] == 0


def test_rows_text_is_json_dumps_bytes():
    """json_out's rows text (what a spooled chunk holds, copied into the JSON file) and its
    writer are exactly json.dumps(indent=1, default=str)'s, whatever the values: random rows,
    names with quotes, non-ASCII and control characters, lists, nested values, floats at the
    limits, values the standard encoder does not know."""
    import random
    from precdbg.compare.report.json_out import encode_rows, write_indent1
    rnd = random.Random(7)

    def value():
        return rnd.choice([None, True, False, rnd.randrange(-10 ** 12, 10 ** 12),
                           rnd.uniform(-1e300, 1e300), 1e308, -0.0, float("nan"),
                           "".join(chr(rnd.randrange(0, 0x2FF)) for _ in range(4)),
                           [rnd.randrange(100) for _ in range(rnd.randrange(4))],
                           [None, 1.5, "x\x00"], "\x00precdbg-list-0\x00"])
    for _ in range(500):
        rows = [{(f"k{j}" if j % 5 else f"\u00e9\"{j}"): value()
                 for j in range(rnd.randrange(1, 12))} for _ in range(rnd.randrange(1, 4))]
        for row in rows:       # a compare row's two shapes (or, now and then, no list)
            row["shape_a"] = [rnd.randrange(9) for _ in range(rnd.randrange(3))]
            row["shape_b"] = rnd.choice([[], [3, 4], None, "[1]"])
            row["after"] = value()
        rows.append({"nested": {"a": 1}, "b": [[1]], "shape_a": [1], "shape_b": []})
        rows.append({"shape_a": [1], "shape_b": [], "odd": Decimal(1)})   # default=str
        want = json.dumps({"rows": rows, "n": 1}, indent=1, default=str)
        assert '{\n "rows": [\n  ' + encode_rows(rows, 2) + '\n ],\n "n": 1\n}' == want
        handle = io.StringIO()
        write_indent1({"rows": rows, "n": 1}, handle)
        assert handle.getvalue() == want


@pytest.mark.parametrize("jobs", [1, 2])
def test_rows_not_kept_are_counted(dumps, jobs):
    """A compare whose rows no file will hold (`precdbg compare` without --json/--csv/--html)
    encodes none: the verdict, notes and counts are those of the compare that keeps them."""
    kept = compare_dumps(dumps[0], dumps[1], jobs=1)
    counted = compare_dumps(dumps[0], dumps[1], jobs=jobs, spool_rows=True, keep_rows=False)
    assert len(counted["rows"]) == len(kept["rows"]) and list(counted["rows"]) == []
    assert summary_text(counted) == summary_text(kept)
    assert {k: v for k, v in counted.items() if k != "rows"} == \
        {k: v for k, v in kept.items() if k != "rows"}


@pytest.mark.parametrize("interrupted", [False, True])
def test_files_read_let_go_of_their_attributes(tmp_path, monkeypatch, interrupted):
    """The check, the optimizer pass and the compare let go of a (step, rank)'s attributes
    once done with its files (14 KB a file as Python objects: 29 MB over 1,024 ranks of two
    dumps, held from the check to the compare), what says whether each holds a whole step
    stays known, and nothing after the compare opens them again: the attributes of a few
    files are held at a time whatever the number of ranks, and an interrupted step is still
    said."""
    from precdbg.storage import step_reader
    ranks = tuple(range(6))
    a = S.write_dump(tmp_path / "a", ranks=ranks, steps=(0,))
    b = S.write_dump(tmp_path / "b", ranks=ranks, steps=(0,), interrupted=interrupted)
    monkeypatch.setattr(step_reader, "KEEP_BYTES", 0)     # no copy kept for the compare
    held, most = set(), [0]
    read_attrs, close = step_reader.StepFile._read_attrs, step_reader.StepFile.close

    def reading(self, handle):
        held.add(self.path)
        most[0] = max(most[0], len(held))
        return read_attrs(self, handle)

    def closing(self, forget=False):
        if forget:
            held.discard(self.path)
        return close(self, forget)
    monkeypatch.setattr(step_reader.StepFile, "_read_attrs", reading)
    monkeypatch.setattr(step_reader.StepFile, "close", closing)
    result = compare_dumps(a, b, spool_rows=True, keep_rows=False)
    assert result["verdict"] == ("incomplete" if interrupted else "match")
    assert 2 <= most[0] <= 6 < 2 * len(ranks)
    whys = {(p["side"], p["rank"], p["why"]) for p in result["incomplete"]}
    assert whys == ({("candidate", r, "interrupted") for r in ranks} if interrupted
                    else set())
    from precdbg.storage.reader import open_dump
    dump = open_dump(b)
    try:
        dump.records(0, 1)
        dump.release(0, 1, forget=True)
        sf = dump.files(0, 1)[0]
        assert sf._attrs is None and sf._file is None
        assert sf.status() == {"interrupted": interrupted, "failures": 0}
        assert sf._file is None and sf._attrs is None        # not opened again for it
        assert sf.attrs["rank"] == 1                          # read again when asked
    finally:
        dump.close()
