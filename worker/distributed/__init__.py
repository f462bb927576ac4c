"""Mechanism for applying a `Plan` with torch's own parallelism: one module per technique
(`tensor_parallel`, `activation_checkpoint`, `data_parallel`, `pipeline_parallel`), composed
by `parallelize` in torchtitan's order (pipeline split, then per part TP → AC → FSDP/DDP)."""
