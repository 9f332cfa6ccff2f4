"""Localize: from the judged pairs to the first divergence, named with its evidence.

`locate`: walks the step's dataflow back from the first difference seen to the earliest
producer whose inputs agree; `verdicts`: the kinds of culprit (an API or module call, a
parameter, input data, a structural difference, the optimizer) and their producer chain;
`callsite`: where the culprit's call ran (file and line, and when for calls outside the model).

Imports: precdbg.errors, precdbg.records, precdbg.storage, precdbg.compare.align, precdbg.compare.judge
"""
