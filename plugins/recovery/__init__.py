"""The recovery engine: classify how an attempt ended, decide what to do next, hand the next
attempt its conf, and keep each training run's lifecycle in the platform state. Pure Python:
the demo, `trainyard launch` and the Airflow DAG all call it (DESIGN §1, §5).

- `model.py`     the contracts (FailureReport, RecoveryAction, AttemptRecord, AttemptConf);
- `evidence.py`  what an attempt left behind (run folder, worker records, node health);
- `classify.py`  evidence → FailureReport, in a documented order of precedence;
- `decide.py`    FailureReport → RecoveryAction (one rule per class, budget, repeat guards);
- `engine.py`    `after_attempt`: classify, decide, quarantine, cordon, record, next conf;
- `state.py`     runs, attempts and node cordons in the platform state database;
- `stop.py`      stopping a run on request; `watch.py` and `steps.py`: the control plane's
                 watching and per-attempt steps that the operators wrap.
"""
