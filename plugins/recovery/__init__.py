"""The recovery engine's pure parts: classify how an attempt ended, decide what to do next, hand
the next attempt its conf, and keep each training run's lifecycle in the platform state. The
attempt engine (`plugins/attempt/`) calls them after every attempt (DESIGN §1, §5).

- `model.py`     the contracts (FailureReport, RecoveryAction, AttemptRecord, AttemptConf);
- `evidence.py`  what an attempt left behind (run folder, worker records, node health);
- `classify.py`  evidence → FailureReport, in a documented order of precedence;
- `decide.py`    FailureReport → RecoveryAction (one rule per class, budget, repeat guards);
- `state.py`     runs, attempts and node cordons in the platform state database.
"""
