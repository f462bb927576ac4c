"""The recovery engine: classify how an attempt ended, decide what to do next, hand the next
attempt its conf. The attempt engine (`plugins/attempt/`) calls it after every attempt
(DESIGN §1, §5).

- `model.py`     the contracts (FailureReport, RecoveryAction, AttemptRecord, AttemptConf);
- `evidence.py`  what an attempt left behind (run folder, worker records, node health);
- `classify.py`  evidence → FailureReport, in a documented order of precedence;
- `decide.py`    FailureReport → RecoveryAction (one rule per class, budget, repeat guards).

Runs, attempts and node cordons are SQL state: `plugins/state/jobs.py`.
"""
