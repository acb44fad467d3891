"""Training and evaluation of the shipped reference models (``engines/lung-seg``, ``nodule-det``).

Used by ``scripts/train_reference_models.py`` and ``scripts/evaluate_reference_models.py``, which
put ``scripts/`` on ``sys.path``. ``data``, ``recipes`` and ``evaluation`` need no torch; ``nets``,
``fit`` and ``export`` do (the ``train`` extra).
"""
