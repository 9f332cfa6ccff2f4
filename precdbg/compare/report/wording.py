"""Every word of a compare's verdict, written once at the end of `compare_dumps`: the decisions
(localize, judge) store codes and typed facts only (`Verdict.facts`, `annotation_facts`, the
chain items' `code` and `_facts`, the evidence items' `_why`, the step causes' `_facts`, notes'
`facts`), and `write_words` turns them into the contract's `reason`, each chain item's `text`,
each evidence item's `why`, each cause's `text` and each note's `text`."""
from __future__ import annotations

import difflib
from typing import Any, Dict, List, Optional, Sequence

from ...records.layers import format_value
from ...records.schema import Role
from ..judge.multistep import UPDATE_SHARE
from ..judge.rows import Note
from ..localize.verdict import FACTS, Annotation, LinkCode, Verdict, VerdictCode
from .note_words import note_text

__all__ = ["write_words", "evidence_why", "structural_reason", "settings_text",
           "param_reason", "cause_text"]

_OUTPUT_WORDS = {Role.OUTPUT: "output", Role.GRAD_INPUT: "gradient for input (dx)",
                 Role.PARAM_GRAD: "weight gradient (dw)"}
_SHOWN_CALLS = 8
_WHEN = {"after_backward": "after the backward, outside the model (gradient clipping, scaling "
                           "or reduction of gradients)",
         "before_forward": "before the model's forward, outside the model (input preparation)"}


def write_words(first: Optional[Verdict], notes: Sequence[Note] = ()) -> None:
    """Fill the words of `first` (its reason, chain, evidence, causes) and of `notes`."""
    for note in notes:
        if note.facts is not None and not note.text:
            note.text = note_text(note.code, note.facts)
    if first is None:
        return
    base = _base_reason(first)
    first.reason = _with_suffixes(first, base)
    for items in (first.evidence.get("inputs_bad", []), first.evidence.get("outputs_bad", [])):
        for item in items:
            if "_why" in item:
                item["why"] = evidence_why(item.pop("_why"))
    for item in first.chain:
        facts = item.pop(FACTS, None)
        if facts is not None:
            text = base.split(":")[0] if item.get("code") == LinkCode.CULPRIT.value \
                else _link_text(LinkCode(item["code"]), facts)
            if facts.get("dropped"):
                text = f"({facts['dropped']} links in between) " + text
            item["text"] = text
    for cause in ([first.cause] if first.cause else []) + (first.candidates or []):
        facts = cause.pop(FACTS, None)
        if facts is not None:
            cause["text"] = base if facts.get("reason") else cause_text(facts)
    if "when" in first.facts:
        first.when = _WHEN[first.facts["when"]]
    weights = first.facts.get("weights")
    if weights is not None and first.parameters is not None:
        first.parameters["reason"] = _full_reason(weights["parameter"])


def _full_reason(verdict: Verdict) -> str:
    return _with_suffixes(verdict, _base_reason(verdict))


def _with_suffixes(v: Verdict, reason: str) -> str:
    for code, facts in v.annotation_facts:
        words = _annotation_words(code, facts)
        if words:
            reason = f"{reason}; {words}" if reason else words
    weights = v.facts.get("weights")
    if weights is not None:
        # the parameter's own reason says which earlier step to dump (or compare) to confirm it
        reason = (f"{reason}; this is what differs in the code that ran, while the weights "
                  f"already differ at the start of step {weights['step']} "
                  f"({weights['name_a']}: {_full_reason(weights['parameter'])})")
    return reason


def evidence_why(facts: Any) -> str:
    """Why a pair differs, in words (appended to a reason): from `Row.why_facts`."""
    if not facts:
        return ""
    if facts["shape_a"] != facts["shape_b"]:
        return f" (shape {facts['shape_a']} vs {facts['shape_b']})"
    if (facts["nan_a"], facts["inf_a"]) != (facts["nan_b"], facts["inf_b"]):
        return (f" (NaN/Inf counts {facts['nan_a']}/{facts['inf_a']} vs "
                f"{facts['nan_b']}/{facts['inf_b']})")
    if facts.get("rel_rmse") is not None:
        return f" (relative RMSE {facts['rel_rmse']:.3g}, cosine {facts['cosine']:.6f})"
    return f" (relative error {facts['err']:.3g} > tolerance {facts['tol']:.1g})"


def _where(module: str) -> str:
    return f"module '{module}'" if module else "the root module"


# ---------------------------------------------------------------------- verdict reasons
def _output_reason(out: Dict[str, Any]) -> str:
    code = VerdictCode(out["code"])
    ev = out["ev"]
    if code is VerdictCode.ARGUMENT:
        args = "; ".join(f"argument {k!r}: {a!r} vs {b!r}" for k, a, b in out["args"])
        if ev is None:
            return f"a non-tensor argument differs ({args})"
        return (f"its tensor inputs agree but a non-tensor argument differs ({args}); its "
                f"{ev['role']} {ev['arg_index']} differs{evidence_why(ev['why'])}")
    what = _OUTPUT_WORDS.get(ev["role"], ev["role"])
    why = evidence_why(ev["why"])
    if code is VerdictCode.NEAR_TIE:
        return (f"its inputs agree within tolerance (largest relative error "
                f"{out['inputs_ok_err']:.3g}) but its {what} {ev['arg_index']}, exact values "
                f"(indices, counts, a mask), differs{why}: a near tie decided by rounding "
                "(a top-k or argmax choosing between almost equal values), expected where the "
                "runs' precisions or kernels differ; the runs take different paths from here")
    if code is VerdictCode.OP_DIFFERS:
        return f"its inputs agree but its {what} {ev['arg_index']} differs{why}"
    return f"its {what} {ev['arg_index']} differs{why} (it has no compared inputs)"


def _candidate_reason(f: Dict[str, Any]) -> str:
    dw = f.get("dw")
    if dw is not None:
        more_text = f" ({dw['more']} more)" if dw["more"] else ""
        zero_text = f"; it is all zero in the {dw['zero']}" if dw["zero"] else ""
        if dw.get("beyond"):
            return "dw-only difference: " + _gradient_words(dw["beyond"]) + \
                ("" if dw["beyond"].get("zero_in") else zero_text)
        if dw["dx_differs"]:
            return (f"the first backward record that differs is the weight gradient of "
                    f"{dw['name']}{more_text}{zero_text}; the forward agrees")
        return ("dw-only difference: forward and dx agree, the weight gradient of "
                f"{dw['name']} does not" + more_text + zero_text)
    text = _output_reason(f["out"])
    if f["backward"]:
        return ("backward-only difference: the forward agrees; " + text
                + (f"; it is all zero in the {f['zero']}" if f["zero"] else ""))
    return text


def _unseen_reason(u: Dict[str, Any], inner: str) -> str:
    if u["decision"] == "inputs_differ":
        args = ", ".join(f"{role} {index}" for role, index in u["args"])
        return (f"input data differs in a way its statistics cannot see: the checksums of "
                f"{u['name']}'s {args} differ while min, max, mean and norm agree, and its "
                f"output differs {u['ratio']:.0f} times its tolerance (a permutation, flip or "
                "shuffle of the input)")
    return (f"its inputs likely differ in a way the statistics cannot see: they agree by every "
            f"statistic, yet {u['name']}, a deterministic call, computes an output "
            f"{u['ratio']:.0f} times its tolerance apart ({inner}); dump with summary_mode "
            "'checksum' (or task 'tensor') to decide between the inputs and the call")


def _uncaptured_inside_reason(f: Dict[str, Any]) -> str:
    where = _where(f["module"])
    back = f["backward"]
    read = "the gradient arriving at" if back else "a value read by"
    side = "its dy agrees but its dx does not" if back else \
        "its inputs agree but its outputs do not"
    head = (f"{'backward-only difference: ' if back else ''}{side}; "
            f"inside it, {read} {f['name']} already differs and no captured call produced it: ")
    why = evidence_why(f["ev"]["why"])
    if f["module_only"]:
        return (head + f"an API call inside {where} computes it, and these dumps hold "
                f"module calls only (level module): dump level mix to name that call{why}")
    return (head + f"a call inside {where} that precdbg does not capture computes it "
            f"(a custom autograd Function, a C++/CUDA extension op, compiled code){why}")


def param_reason(step: int, metrics: Dict[str, Any], previous_matched: bool,
                 setup: Sequence[str], others: Sequence[str] = ()) -> str:
    """Why a parameter differs at the start of `step`, in terms a user can check. `setup`:
    the optimizer set-up differences; `others`: the other set-up differences of high or
    medium impact (compute dtypes, world size), which change the update through the gradient
    (within its tolerance) or through what is reduced across ranks after the dw records."""
    return _param_reason({"step": step, "share": metrics.get("update_share"),
                          "dw": metrics.get("dw_agreed"), "previous_matched": previous_matched,
                          "setup": list(setup), "others": list(others)})


def _param_reason(f: Dict[str, Any]) -> str:
    """`param_reason` from the facts of localize.verdicts' inventory verdict."""
    step, setup, others = f["step"], f["setup"], f["others"]
    if not f["previous_matched"]:
        return "parameter values differ at start"
    head = (f"parameters differ at the start of step {step} while step {step - 1} matched: "
            + ("the update differs" if others and not setup else "the optimizer update differs"))
    share, dw = f["share"], f["dw"]
    parts = []
    if share is not None:
        parts.append(f"its statistics moved differently since step {step - 1}: by {share:.1%} "
                     "of the baseline's update as its statistics (min, max, mean, norm, "
                     "pos_mean) show it (a detector, not the update's own relative difference; "
                     f"float noise through the optimizer stays under {UPDATE_SHARE:.0%})")
    if dw is not None:
        agreed = ("agreed within its tolerance, but the set-up differs" if others else
                  "agreed: the same gradient gave a different update")
        parts.append(f"step {step - 1}'s weight gradient (dw) "
                     + (agreed if dw else "already differed"))
    if setup or others:
        parts.append("set-up: " + "; ".join((list(setup) + list(others))[:3]))
    else:
        parts.append("optimizer type, hyperparameters, param groups or loss scale")
    return head + " (" + "; ".join(parts) + ")"


def _inventory_reason(f: Dict[str, Any]) -> str:
    what, step, rank = f["what"], f["step"], f["rank"]
    reason = {"trainable": "parameter is trainable in one run and frozen in the other",
              "only_in": f"parameter inventory differs: {f['name']} (only in the "
                         f"{f['only_in']})",
              "shapes": "parameter shapes differ"}.get(what) or _param_reason(f["param"])
    if f["more"]:
        reason += f" ({f['more']} more parameter(s) differ)"
    entered = f.get("entered")
    if entered == "earlier":
        reason += (f": the runs entered step {step} with different weights, and step "
                   f"{step - 1} (rank {rank}), which both dumps hold but this compare left out, "
                   "already differs: compare without --step to see where")
    elif entered == "not_compared":
        reason += (f": the runs entered step {step} with different weights, and step "
                   f"{step - 1} (rank {rank}) was not compared: the difference arose in a step "
                   "that is not in both dumps; dump every step from the last one that matched")
    elif entered == "not_dumped":
        reason += (f": the runs entered step {step} with different weights (the "
                   "initialisation, the checkpoint, or an earlier step that was not dumped); "
                   "dump from the first training step, or load one checkpoint in both")
        if f["others"]:
            reason += ("; set-up differences an earlier training step turns into other "
                       "weights: " + "; ".join(list(f["others"])[:2]))
    return reason


def _unfinished_reason(f: Dict[str, Any]) -> str:
    other = "baseline" if f["side"] == "candidate" else "candidate"
    if f["other_entry"]:
        how = f"{f['entry']} began and did not return (in the {other} it did)"
    else:
        how = "the process ended in it (the step file is marked interrupted)"
    return (f"the {f['side']}'s step stopped early, inside {_where(f['module'])}: {how}; its "
            f"last record is {f['last_record']}, and {f['records_after']} record(s) of the "
            f"{other} from there on have no counterpart (an exception the training script "
            "caught before stop(), or a process that ended): what ran before agrees as far "
            "as both got")


def _base_reason(v: Verdict) -> str:
    """The verdict's reason before its annotations' words."""
    f = v.facts
    form = f.get("form")
    ev = f.get("ev")
    why = evidence_why(ev["why"]) if ev else ""
    if form == "candidate":
        text = _candidate_reason(f)
        unseen = f.get("unseen")
        return _unseen_reason(unseen, text) if unseen is not None else text
    if form == "uncaptured_inside":
        return _uncaptured_inside_reason(f)
    if form == "input_data":
        return (f"input data differs: its {ev['role']} {ev['arg_index']} was produced by "
                f"nothing captured in the step (the batch, RNG, the data loader) and already "
                f"disagrees{why}")
    if form == "arriving_grad":
        return f"the gradient arriving here already differs (loss or an uncaptured op){why}"
    if form == "grad_changed_after_hook":
        return (f"the weight gradient {f['param']} agrees as its hook recorded it, but "
                f"{f['name']} reads it changed (its {ev['role']} {ev['arg_index']} "
                f"differs{why}): something changed the gradient after it was recorded, "
                "outside the captured calls - a gradient hook registered after start() (it "
                "runs after precdbg's), or code that writes .grad")
    if form == "one_run_writer":
        return (f"only the {f['side']} calls {f['writer']}, which writes its input in place: "
                f"{f['name']} reads its {ev['role']} {ev['arg_index']} changed{why}, while "
                f"{f['producer']}, which produced it, agrees")
    if form == "changed_after":
        return (f"its {ev['role']} {ev['arg_index']} differs{why} while {f['producer']}, "
                "which produced it, agrees: something not captured changed it in between")
    if form == "calls_differ":
        who = f["who"]
        return (f"calls differ in {_where(f['module'])}: {f['name']} reads what "
                + (f"only the {who} computes ({f['p_name']})" if who else
                   f"each run computes differently (baseline {f['name_a']}, candidate "
                   f"{f['name_b']})"))
    if form == "inventory":
        return _inventory_reason(f)
    if form == "structural":
        return structural_reason(f["diff"])
    if form == "unfinished":
        return _unfinished_reason(f)
    if form == "cause":
        return cause_text(f["cause"])
    return v.reason


def _annotation_words(code: Annotation, f: Dict[str, Any]) -> str:
    if code is Annotation.CHECKSUMS_DECIDE:
        return "its inputs are bit for bit equal (checksums): the call itself computes " \
            "differently" if f.get("op_differs") else ""
    if code is Annotation.LAYER_SETTING:
        return (f"module '{f['module']}' is constructed with other settings: "
                + settings_text(f["settings"]))
    if code is Annotation.NUMBERS_DIFFER:
        return _output_reason(f["out"])
    if code is Annotation.LOSS_SCALE:
        return (f"{f['message']}: a loss scaled in one run only scales every gradient "
                "computed from it, so the backward differs from here on by that factor "
                "(compare runs that scale alike, or both unscaled)")
    if code is Annotation.GRADIENT_STOPPED:
        return f"only the {f['side']} calls {', '.join(f['stops'])}, which stops the gradient"
    if code is Annotation.CALLS_IN_ONE_RUN_ONLY:
        return f"only the {f['who']} calls {', '.join(f['names'])} inside it"
    return ""


# ---------------------------------------------------------------------- chain, causes
def _at(f: Dict[str, Any], key: str = "where") -> str:
    return f" on rank {f[key]}" if f.get(key) is not None else ""


def _link_text(code: LinkCode, f: Dict[str, Any]) -> str:
    name = f.get("name", "")
    if code is LinkCode.DIFFERENTIATES_FORWARD:
        return f"{name}{_at(f)} differentiates {f['other']}, whose forward already differs"
    if code is LinkCode.GRADIENT_OF:
        return f"{name}{_at(f)} is the gradient {f['other']} produced, which differs"
    if code is LinkCode.READS_OUTPUT:
        return f"{name}{_at(f)} reads the output of {f['other']}{_at(f, 'other_where')}, " \
            "which differs"
    if code is LinkCode.ONE_RUN_PRODUCER:
        how = "the runs compute with different calls" if f["both"] else \
            f"only the {f['side']} computes"
        return f"{name}{_at(f)} reads the output of {f['other']}, which {how}"
    if code is LinkCode.SAME_MEMORY:
        return f"{name}{_at(f)} reads memory that {f['other']} wrote earlier, which differs"
    if code is LinkCode.COLLECTIVE_RANK:
        return (f"{name}{_at(f)} reads {f['other']}, which agrees on rank {f['rank']} but was "
                f"changed after it by a collective across ranks; on rank {f['other_rank']} it "
                "differs")
    if code is LinkCode.CHANGED_AFTER:
        return (f"{name}{_at(f)} reads the output of {f['other']}, which agrees; something "
                "not captured changed it in between")
    if code is LinkCode.ARRIVING_GRAD:
        return f"the gradient arriving at {name}{_at(f)} differs and no captured call " \
            "produced it"
    if code is LinkCode.INPUT_DATA:
        return f"{name}{_at(f)} reads input data that differs (nothing captured in the step " \
            "produced it)"
    if code is LinkCode.COLLECTIVE_INPUT:
        return (f"{name} is a collective: its inputs agree on rank {f['rank']}, its output "
                f"differs because rank {f['other_rank']}'s input differs")
    if code is LinkCode.CANDIDATE:
        return f"{name}{_at(f)} differs while its inputs agree"
    if code is LinkCode.INSIDE:
        return f"{name}'s outputs differ while its inputs agree; the first record inside it " \
            "that differs:"
    if code is LinkCode.CALLS_DIFFER:
        return (f"{f['name_a'] or '(nothing)'} in the baseline vs {f['name_b'] or '(nothing)'} "
                "in the candidate: the calls (or the module's class) differ between the runs")
    if code is LinkCode.CHANGED_IN_BETWEEN:
        return f"{name} reads the output of {f['other']}, which agrees, changed in between"
    if code is LinkCode.START_OF_STEP:
        return f"{name} differs at the start of step {f['step']}"
    if code is LinkCode.STRUCTURAL:
        return f"{f['name_a']} and {f['name_b']} run different code (a structural difference)"
    if code is LinkCode.STOPPED:
        return f"the {f['side']}'s step stopped inside {_where(f['module'])}"
    if code is LinkCode.CAUSE:
        return cause_text(f["cause"])
    raise ValueError(code)


def _gradient_words(g: Dict[str, Any]) -> str:
    """A weight gradient far beyond what its module read (judge dw_beyond_inputs), in words."""
    read = ("its module's reads and its weights at the step's start differ at most "
            f"{g['explained']:.3g}" if g["explained"] is not None
            else "what its module read differs in shape")
    if g.get("zero_in"):
        return (f"the weight gradient of {g['name']} is all zero in the {g['zero_in']} only, "
                f"which no difference of what its module read makes ({read}): a gradient "
                "cut or never computed there")
    times = "" if g["ratio"] is None else f"{g['ratio']:.0f} times "
    tol = f", tolerance {g['tol']:.3g}" if isinstance(g.get("tol"), float) else ""
    return (f"the weight gradient of {g['name']} differs (relative error {g['err']:.3g}{tol}) "
            f"{times}beyond what its module read and its weights at the step's start "
            f"(at most {g['explained'] or 0.0:.3g}): computed differently, in its module's "
            "backward or a function of its own (a custom autograd.Function, a gradient hook)")


def cause_text(f: Dict[str, Any]) -> str:
    """A step cause's words (localize.step_causes)."""
    if "diff" in f:
        return structural_reason(f["diff"])
    if "gradient" in f:
        return _gradient_words(f["gradient"])
    if "message" in f:
        return f"the optimizer set-up of step {f['step']} differs: {f['message']}"
    return (f"only the {f['side']} calls {f['name']} (module '{f['module']}')"
            + (", which writes its input in place" if f["writes"] else ""))


# ---------------------------------------------------------------------- structural
def settings_text(settings: Sequence[Sequence[Any]]) -> str:
    """(setting, baseline value, candidate value) triples, in words."""
    return ", ".join(f"{s} {format_value(a)} vs {format_value(b)}" for s, a, b in settings)


def structural_reason(d: Dict[str, Any]) -> str:
    """A structural difference (judge.structural_diff `StructuralDiff.facts()`), in words."""
    class_differs = d["class_a"] != d["class_b"]
    calls_differ = class_differs or d["calls_a"] != d["calls_b"]
    parts = []
    if class_differs:
        parts.append(f"class {d['class_a']} vs {d['class_b']}")
    if d["times"] is not None and not class_differs:
        parts.append(f"it runs {d['times'][0]} time(s) in the baseline and {d['times'][1]} "
                     "in the candidate, making the same calls each time (the micro-batches "
                     "of a gradient accumulation, or a module called again)")
    elif d["calls_a"] != d["calls_b"]:
        parts.append(_calls_apart(d["calls_a"], d["calls_b"]))
    what = "calls differ"
    if d["settings"]:
        parts.append(settings_text(d["settings"]))
        what = "calls and layer settings differ" if calls_differ else "layer settings differ"
    return (f"{what} in {_where(d['module'])}: " + "; ".join(parts)
            + " (a structural difference: it counts whether or not the numbers stay within "
              "tolerance)")


def _shown(calls: List[str]) -> str:
    if not calls:
        return "nothing"
    text = ", ".join(calls[:_SHOWN_CALLS])
    return text + (f", ... ({len(calls)} calls)" if len(calls) > _SHOWN_CALLS else "")


def _calls_apart(calls_a: List[str], calls_b: List[str]) -> str:
    """Where two call lists part: the whole lists when short, otherwise the first place they
    differ (what one run calls in addition, or instead), counting the other places."""
    if len(calls_a) <= _SHOWN_CALLS and len(calls_b) <= _SHOWN_CALLS:
        return f"the baseline calls {_shown(calls_a)}, the candidate {_shown(calls_b)}"
    places = [op for op in difflib.SequenceMatcher(None, calls_a, calls_b, autojunk=False)
              .get_opcodes() if op[0] != "equal"]
    tag, i1, i2, j1, j2 = places[0]
    after = f"after {calls_a[i1 - 1]} (call {i1} of {len(calls_a)})" if i1 else "first"
    if tag == "insert":
        text = f"the candidate also calls {_shown(calls_b[j1:j2])} {after}"
    elif tag == "delete":
        text = f"the baseline also calls {_shown(calls_a[i1:i2])} {after}"
    else:
        text = (f"{after}, the baseline calls {_shown(calls_a[i1:i2])}, the candidate "
                f"{_shown(calls_b[j1:j2])}")
    more = len(places) - 1
    return text + (f"; they differ in {more} more place(s)" if more else "") + \
        f"; {len(calls_a)} vs {len(calls_b)} calls"
