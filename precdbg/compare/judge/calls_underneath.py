"""Judge `calls_underneath`: what a torch shim runs underneath the model, in a shim dump compared
with PyTorch's (one vocabulary of names, two frameworks).

The shim runs PyTorch's model code, but below it its own: its masking and position code, its own
defaults handed on as arguments, its kernels. Measured on Hugging Face GPT-2 and Llama (tiny,
transformers 4.57.6, mindnlp 0.5.1 and 7dd3e355 against torch 2.13), the clean pairs at level
mix: 4 to 5 modules make other calls or pass other arguments (`model.rotary_emb`, every
`self_attn`: the shim's `finfo(float32).min` of -3.40282e+38, the mask it builds itself) and
about 150 records of calls one run makes (`Torch.arange`, `Torch.cat`, `Functional.dropout` of
p 0) - each would have been the headline of a pair that computes the same numbers.

So, for a shim pair: a structural difference in a module's calls or call arguments is a note,
never a cause; one that changes what the layer is (another class for a known layer, its own
numeric settings such as eps or momentum) still is. The calls one run makes are not causes of a
step whose weights entered apart (their numbers are judged where they are read, as always).
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from .structural_diff import StructuralDiff

__all__ = ["JUDGE_ID", "layer_changed", "split_underneath", "causal_one_run_calls"]

JUDGE_ID = "calls_underneath"


def layer_changed(diff: StructuralDiff) -> bool:
    """A structural difference a torch shim does not make by running its own code underneath
    the model: a known layer's class became another, or a layer's own numeric settings (eps,
    momentum) differ (its calls' arguments do not count: the shim passes its own)."""
    return diff.class_differs or any(not s.call for s in diff.settings)


def split_underneath(structural: Sequence[StructuralDiff], shim_pair: bool
                     ) -> Tuple[List[StructuralDiff], List[StructuralDiff]]:
    """(the structural differences that stay causes, those that are the shim's code underneath
    the model: the note `calls_underneath`). Not a shim pair: all stay."""
    if not shim_pair:
        return list(structural), []
    underneath = [d for d in structural if not layer_changed(d)]
    return [d for d in structural if layer_changed(d)], underneath


def causal_one_run_calls(calls: List[Dict[str, Any]], shim_pair: bool) -> List[Dict[str, Any]]:
    """The calls one run makes that may be a step's cause: none for a shim pair."""
    return [] if shim_pair else calls
