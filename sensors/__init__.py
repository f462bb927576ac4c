"""The deferrable watchers of a running attempt (`watch.py`: training, checkpoints, health) and
the triggers behind them (`triggers.py`), which run in Airflow's triggerer and hold no worker slot
while training runs."""
