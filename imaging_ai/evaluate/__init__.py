"""`imaging-ai evaluate`: takes a folder of cases with references; gives Dice, lesion hits,
false positives, FROC / CPM as summary.json, froc.png, per-case PNGs and a table.

The local validation a hospital runs before go-live and after every model change: each case
goes through the daemon's own analysis path with the configured models. Modules: ``cases``
(images and references), ``lidc`` and ``contours`` (reader XML, RTSTRUCT, SEG), ``metrics``,
``run`` (analysis and scoring), ``report`` (outputs), ``cli``.
"""
