"""The models Trainyard's own worker trains (`llama.py`: a Llama-style decoder built from the
spec's `parallelism.hints`). A team's own script brings its own model."""
