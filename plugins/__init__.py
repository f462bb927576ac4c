"""The engines, one room each, none importing Airflow (DESIGN §1-§2), over one floor (`run`: what a
run's processes exchange): `advisor` (plans), `validation`, `placement`, `launch`, `checkpoint`,
`data`, `storage`, `tracking` (MLflow), `recovery` (classify and decide), `attempt` (one
attempt's steps, over all of them) and `control_room` (the Trainyard view). `trainyard_plugin.py`
is the Airflow plugin that serves the view; `tests/unit/test_import_graph.py` holds each room to
its floor."""
