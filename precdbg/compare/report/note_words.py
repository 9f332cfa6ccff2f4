"""The words of a compare's notes (`Note.text`), from each note's code and facts: the judges'
notes (judge.multistep NoisePolicy) and the pipeline's (pipeline.py). Called by wording.py's
`write_words`."""
from __future__ import annotations

from typing import Any, Dict

from ..judge.multistep import UPDATE_SHARE
from ..judge.rows import NoteCode

__all__ = ["note_text"]


def note_text(code: NoteCode, f: Dict[str, Any]) -> str:
    """A note's words from its facts (the judges' notes: judge.multistep NoisePolicy)."""
    if code is NoteCode.UPDATE_OF_ROUNDING:
        step = f["step"]
        return (f"step {step}: {f['count']} parameter(s) (first: {f['first']}) whose weight "
                f"gradient at step {step - 1} was rounding noise in both runs (so small "
                "against the gradient it was summed from that rounding is over a tenth of it, "
                "like an attention key bias's) differ by what the optimizer made of that "
                "noise (Adam turns it into updates of up to about +-lr): not counted as a "
                "divergence")
    if code in _PIPELINE_NOTES:
        return _PIPELINE_NOTES[code](f)
    steps = ", ".join(str(s) for s in f["steps"])
    if code is NoteCode.JUDGED_BY_ROUNDING:
        return (f"parameters of step(s) {steps} judged against float rounding: the optimizer "
                "set-up differs (see setup)")
    if code is NoteCode.JUDGED_BY_UPDATE:
        unknown = f["unknown"]
        why = "optimizers configured alike" if not unknown else \
            (f"the optimizer set-up of the {' and the '.join(unknown)} is not known (no run "
             "manifest), judged as if configured alike")
        if f["conventions"] and not unknown:
            why = ("optimizers configured alike but for a convention of low impact, whose "
                   "effect this measures (see setup)")
        return (f"step(s) {steps}: parameters judged by how much the runs' last updates differ "
                f"(diverged above {UPDATE_SHARE:.0%} of the baseline's update), the other "
                f"records above a floor from the parameters' difference: {why}")
    raise ValueError(code)


# the notes compare_dumps (pipeline.py) makes
_PIPELINE_NOTES = {
    NoteCode.PREVIOUS_STEP_UNREAD: lambda f: (
        f"step {f['step']} rank {f['rank']}, the step before the one compared, could not be "
        f"read to judge it ({f['error']})"),
    NoteCode.STEP_UNREAD: lambda f: (
        f"step {f['step']} rank {f['rank']} not compared: "
        + (f"the {f['side']}'s file cannot be read" if f['side'] else "it cannot be read")
        + f" ({f['error']}); the other steps and ranks are compared"),
    NoteCode.RELABELLED: lambda f: (
        f"compared the baseline's step {f['a'][0]} rank {f['a'][1]} with the candidate's step "
        f"{f['b'][0]} rank {f['b'][1]} (the one step and rank each holds); results name the "
        "baseline's"),
    NoteCode.FRAMEWORKS_DIFFER: lambda f: (
        f"frameworks differ ({f['a'] or '?'} vs {f['b'] or '?'}): records aligned by module "
        "path, canonical op and order"),
    NoteCode.CALLS_UNDERNEATH: lambda f: (
        f"{f['b'] or '?'} runs PyTorch's code under PyTorch's names on another framework: "
        f"{len(f['modules'])} module(s) make other calls there, or pass other arguments (its "
        f"own code underneath the model, not a cause by itself): "
        + ", ".join(repr(m or '(root)') for m in f["modules"][:5])
        + (f" (+{len(f['modules']) - 5} more)" if len(f["modules"]) > 5 else "")),
    NoteCode.PRECISION_ARGUMENTS: lambda f: (
        f"{f['count']} dtype argument(s) name another float dtype where the runs' values "
        f"already carry other precisions (first: {f['first']}): counted as that precision "
        "difference (status 'precision'), not as divergences"),
    NoteCode.INTEGER_PLUMBING: lambda f: (
        f"{f['count']} integer or boolean record(s) differ (first: {f['first']} {f['role']} "
        f"{f['arg_index']}) in step(s) where every floating-point record agrees: positions, "
        "masks or indices computed another way (transformers with and without use_cache, which "
        "gradient checkpointing turns off), not divergences (status 'integer'); where such a "
        "difference changes numbers, the floating-point records that read it differ and are "
        "compared"),
    NoteCode.ROUNDING_FLOOR: lambda f: (
        f"{f['count']} record(s) far smaller than the gradient they were reduced from (first: "
        f"{f['first']} {f['role']} {f['arg_index']}: a sum whose terms cancel, like an "
        "attention key bias's gradient, and what is computed from it) judged against that "
        "gradient's rounding, not their own scale (column 'floor')"),
    NoteCode.TOOLS_DIFFER: lambda f: (
        f"the baseline was dumped by {f['a']}, the candidate by {f['b']}: compared on the "
        "records both tools write and the statistics both measure; msprobe records no NaN/Inf "
        "counts, no order-sensitive mean, no root module, no buffers and not the calls its risk "
        "level skips (reshape, to, view, ...), and its API backward records are the gradients "
        "of one autograd node, so API backward records, NaN/Inf counts and checksums are not "
        "compared (modules' backward records and weight gradients are)"
        + ("; on MindSpore msprobe records the primitives a Cell runs where precdbg records "
           "its functional calls, so no API call is compared: Cells, parameters and weight "
           "gradients are" if "mindspore_api_calls" in f.get("limits", ()) else "")),
    NoteCode.MSPROBE_DUMPS: lambda f: (
        f"the {' and the '.join(f['sides'])} {'were' if len(f['sides']) > 1 else 'was'} "
        "written by msprobe, which records no producer of a tensor (the chain to the cause "
        "follows the order of the calls and their module, not the data), counts no NaN/Inf "
        "values (only whether there are some) and takes no order-sensitive mean"
        + ("; no parameter or weight gradient is compared (msprobe records none at level L1)"
           if f.get("no_parameters") else "")
        + "".join(f"; {line}" for line in f.get("files", ()))),
    NoteCode.STATISTICS_ONLY: lambda f: (
        "statistics only: a permutation or a compensating change keeps min, max, mean and "
        "norm; dump with task 'tensor' or summary_mode 'checksum' to confirm a match bit for "
        "bit"),
}
