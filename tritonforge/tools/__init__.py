"""Instruments around a served repository: the benchmark, the accuracy evaluation, CPU profiling of the
server's processes and the tiny model (with the corpus and prompts they read, data/)."""
