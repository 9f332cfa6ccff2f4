"""Report: the compare's result as text, JSON, CSV and one self-contained HTML page.

`formats`: the terminal summary and the JSON and CSV files; `html` (with `assets/`): the page
with the module tree, the per-module overview and the per-step timelines; `notes`: what was not
compared and why; `wording` and `note_words`: every word of the verdict and the notes, from their
codes and facts; `progress`: progress on a terminal for long compares; `row_store`: the rows of a compare per
(step, rank), in memory or spooled to disk.

Imports: precdbg.errors, precdbg.records, precdbg.storage, precdbg.compare.align, precdbg.compare.judge, precdbg.compare.localize
"""
